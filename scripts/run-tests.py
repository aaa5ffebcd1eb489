#!/usr/bin/env python3
"""Runs the test suite's parts side by side: every test executable `cargo test --no-run` built
(read from its JSON messages on standard input), the service suites again against a Redis
Cluster, and whole scripts, at most LANES at a time, longest first, with the parts named by
--beside (which mostly wait) in one more lane of their own; then the parts named by --alone, one
after another with nothing beside them.

Many parts wait (on leases, timeouts, Redis restarts) more than they compute, so on a 2-core
machine two at a time finish sooner than one after another (this suite's: about 400 s against
680). Parts that load the machine on purpose and time the outcome run alone, and on a machine
that other work keeps busy every part does (see IDLE_ENOUGH). Each part
writes to a log of its own; the log is printed whole when the part ends, so outputs never
interleave. Exits 1 if any part fails or outlasts PART_TIMEOUT, after every part has ended.

    cargo test --no-run --message-format=json-render-diagnostics \\
      | scripts/run-tests.py --lanes 2 --cluster lock semaphore \\
          --script "client packages=scripts/client-tests.sh"

Runs each executable as `cargo test` does: from its package's directory, with CARGO_MANIFEST_DIR
set to it.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

# A part running longer than this is stopped and failed: a hang must not hold CI for hours.
PART_TIMEOUT = 20 * 60

# Seconds each part took in an earlier run on the 2-core machine, to start the long ones first
# (a long part started last would run alone at the end). Only the order depends on them.
EXPECTED_SECONDS = {
    "autocomplete (cluster)": 100,
    "autocomplete": 80,
    "lock (cluster)": 52,
    "soak": 41,
    "lock": 33,
    "failover": 30,
    "smoke": 25,
    "semaphore (cluster)": 23,
    "metrics": 20,
    "keepalive": 19,
    "ratelimit (cluster)": 15,
}


# Parts run side by side only on CPUs this idle before they start: on a machine that other work
# already loads, two parts at a time would starve the tests that time Redis and Baton (an
# autocomplete Add outran its 2 s Redis timeout beside two busy loops), so they run one by one.
IDLE_ENOUGH = 0.6
IDLE_SAMPLE = 3
# The most parts `--lanes auto` runs at once, however many CPUs: each may start a Redis Cluster.
MAX_AUTO_LANES = 4


def idle_share():
    """The share of CPU time the machine left idle over IDLE_SAMPLE seconds (/proc/stat)."""

    def times():
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, all

    idle0, all0 = times()
    time.sleep(IDLE_SAMPLE)  # one measurement, not a wait on anything
    idle1, all1 = times()
    return (idle1 - idle0) / max(1, all1 - all0)


class Part:
    """One thing to run: a command, where and with what environment; its log and outcome."""

    def __init__(self, name, argv, cwd, env=None, expected=None):
        self.name, self.argv, self.cwd, self.env = name, argv, cwd, env or {}
        self.expected = EXPECTED_SECONDS.get(name, 10) if expected is None else expected
        self.seconds = self.code = None
        # A part that runs one test by name fails if that name matched none.
        self.one_test = False

    def run(self):
        """Runs the part to its end (stopping it past PART_TIMEOUT); returns its output."""
        started = time.monotonic()
        with tempfile.TemporaryFile() as log:
            proc = subprocess.Popen(self.argv, cwd=self.cwd, env=dict(os.environ, **self.env),
                                    stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                self.code = proc.wait(timeout=PART_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                self.code = proc.wait()
                log.write(f"\n{self.name}: stopped after {PART_TIMEOUT} s\n".encode())
            self.seconds = time.monotonic() - started
            log.seek(0)
            output = log.read().decode(errors="replace")
            if self.one_test and self.code == 0 and "\nrunning 1 test\n" not in output:
                self.code = 1
                output += f"\n{self.name}: no test of that name ran\n"
            return output


def test_executables(messages):
    """(name, executable, package directory) of every test executable in cargo's JSON messages,
    in the order cargo built them."""
    found = []
    for line in messages:
        if not line.startswith("{"):
            continue
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg["profile"]["test"]:
            continue
        target = msg["target"]
        directory = os.path.dirname(msg["manifest_path"])
        kind = target["kind"][0]
        if kind == "test":
            name = target["name"]
        else:
            name = f"{target['name']} ({kind} unit tests)"
        found.append((name, msg["executable"], directory))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lanes", default="auto",
                        help="parts run at once: a number, or auto (the default): one per CPU "
                             "(at most 4) when the CPUs are idle before the parts start, else one")
    parser.add_argument("--cluster", nargs="*", default=[],
                        help="integration tests of the root package to run again with "
                             "BATON_TEST_TOPOLOGY=cluster")
    parser.add_argument("--not-on-cluster", action="append", default=[], metavar="PART=TEST",
                        help="a test (its full name) that the Cluster run of PART leaves out")
    parser.add_argument("--script", action="append", default=[], metavar="NAME=COMMAND",
                        help="a shell command to run as one part")
    parser.add_argument("--beside", nargs="*", default=[],
                        help="parts that mostly wait (on other processes, timeouts) to run in a "
                             "lane of their own beside the others, when there are two lanes or "
                             "more")
    parser.add_argument("--alone", nargs="*", default=[],
                        help="parts to run with no other part beside them, after the others "
                             "(tests that load the machine on purpose and time what it does); "
                             "PART=TEST runs only that test (its full name) of PART alone, and "
                             "the rest of PART beside the others")
    args = parser.parse_args()

    root = os.getcwd()
    parts = []
    executables = test_executables(sys.stdin)
    if not executables:
        sys.exit("run-tests: no test executable in cargo's messages on standard input")
    names = set()
    off_cluster = {}
    for spec in args.not_on_cluster:
        name, _, test = spec.partition("=")
        off_cluster.setdefault(name, []).extend(["--skip", test])
    for name, exe, directory in executables:
        if name in names:
            name = f"{name} ({os.path.relpath(directory, root)})"
        names.add(name)
        env = {"CARGO_MANIFEST_DIR": directory}
        parts.append(Part(name, [exe], directory, env))
        if name in args.cluster and directory == root:
            parts.append(Part(f"{name} (cluster)", [exe, *off_cluster.get(name, [])], directory,
                              dict(env, BATON_TEST_TOPOLOGY="cluster")))
    missing = (set(args.cluster) | set(off_cluster)) - names
    if missing:
        sys.exit(f"run-tests: --cluster names no integration test: {sorted(missing)}")
    for spec in args.script:
        name, _, command = spec.partition("=")
        parts.append(Part(name, ["bash", "-c", command], root, expected=1000))

    alone_names = set()
    for spec in args.alone:
        name, _, test = spec.partition("=")
        part = next((p for p in parts if p.name == name), None)
        if part is None:
            sys.exit(f"run-tests: --alone names no part: {name}")
        if not test:
            alone_names.add(name)
            continue
        # The one test alone; the part runs the others beside the rest, as usual.
        single = Part(f"{name}: {test}", [part.argv[0], "--exact", test], part.cwd, part.env,
                      expected=part.expected)
        single.one_test = True
        part.argv = [*part.argv, "--skip", test]
        parts.append(single)
        alone_names.add(single.name)
    unknown = set(args.beside) - {p.name for p in parts}
    if unknown:
        sys.exit(f"run-tests: --beside names no part: {sorted(unknown)}")
    waiting = sorted((p for p in parts if p.name not in alone_names), key=lambda p: -p.expected)
    alone = [p for p in parts if p.name in alone_names]
    lock = threading.Lock()
    begun = time.monotonic()

    def lane(queue):
        while True:
            with lock:
                if not queue:
                    return
                part = queue.pop(0)
            output = part.run()
            verdict = "passed" if part.code == 0 else f"FAILED (exit {part.code})"
            with lock:
                print(f"==> {part.name}: {verdict} in {part.seconds:.0f} s "
                      f"(at {time.monotonic() - begun:.0f} s of the parts)\n{output}", flush=True)

    if args.lanes == "auto":
        idle = idle_share()
        count = min(os.cpu_count() or 1, MAX_AUTO_LANES) if idle >= IDLE_ENOUGH else 1
        print(f"==> the CPUs were {idle:.0%} idle over {IDLE_SAMPLE} s", flush=True)
    else:
        count = int(args.lanes)
    beside = []
    if count >= 2:
        beside = [p for p in waiting if p.name in args.beside]
        waiting = [p for p in waiting if p.name not in args.beside]
    print(f"==> {len(waiting)} parts, {count} at a time"
          f"{f', {len(beside)} more in a lane of their own' if beside else ''}, "
          f"then {len(alone)} alone", flush=True)
    lanes = [threading.Thread(target=lane, args=(waiting,)) for _ in range(count)]
    if beside:
        lanes.append(threading.Thread(target=lane, args=(beside,)))
    for t in lanes:
        t.start()
    for t in lanes:
        t.join()
    lane(alone)
    done = parts

    failed = [p for p in done if p.code != 0]
    print("==> the parts, longest first:")
    for part in sorted(done, key=lambda p: -p.seconds):
        print(f"    {part.seconds:6.0f} s  {part.name}"
              f"{'' if part.code == 0 else '  FAILED'}")
    if failed:
        print(f"==> {len(failed)} of {len(done)} parts failed: "
              f"{', '.join(p.name for p in failed)}")
        sys.exit(1)
    print(f"==> all {len(done)} parts passed in {time.monotonic() - begun:.0f} s")


if __name__ == "__main__":
    main()
