"""Shared scaffolding for the contract tests: a private redis-server and a Baton process.

Each test class starts its own redis-server on a free port (no persistence) and its own Baton
binary (BATON_BIN) with a unique key prefix, waits until readiness is SERVING, and stops both by
pid. The generated client lives in BATON_PY_GEN (see scripts/python-tests.sh).
"""

import os
import signal
import socket
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.environ["BATON_PY_GEN"])

import grpc  # noqa: E402
from google.protobuf.duration_pb2 import Duration  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402


def ms(n):
    """A protobuf Duration of n milliseconds."""
    return Duration(seconds=n // 1000, nanos=(n % 1000) * 1_000_000)


def free_port():
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what, check, timeout=10.0):
    """Polls `check` until it returns true, failing with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as e:  # noqa: BLE001 - reported below if it never succeeds
            last = e
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what} (last error: {last})")


def freeze(pid):
    """Freezes process `pid` with SIGSTOP and returns once every one of its threads has stopped:
    `kill` only queues the signal, and until each thread has taken it a thread of a busy machine
    can still answer a request sent after the `kill`."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 30
    while True:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            return
        states = []
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/stat", encoding="utf-8") as f:
                    # The state follows the command's closing parenthesis: T or t once stopped.
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except (FileNotFoundError, ProcessLookupError, IndexError):
                pass
        if all(s in "TtZX" for s in states):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} did not stop within 30 s of SIGSTOP: {states}")
        time.sleep(0.001)


class Redis:
    """A redis-server child on a free port, restartable on the same port; with `password`, it
    requires that password (`requirepass`)."""

    def __init__(self, workdir, password=None):
        self.dir = workdir
        self.port = free_port()
        self.password = password
        self.proc = None
        self.start()

    def start(self):
        auth = ["--requirepass", self.password] if self.password else []
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir,
             "--logfile", os.path.join(self.dir, "redis.log"), *auth])

        def pong():
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                # Without a password a PING answers PONG; with one, it answers NOAUTH: either
                # way the server is up.
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith((b"+PONG", b"-NOAUTH"))
        wait_until("redis-server to answer PING", pong)

    def kill(self):
        """Kills the server by pid (SIGKILL) if it still runs."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class Baton:
    """The baton binary serving over `redis_port`, with `extra` flags for `baton serve`, under a
    key prefix of its own, or `prefix` (Batons sharing one are sidecars of one application), and
    a 2 s Redis command timeout unless `extra` sets one."""

    def __init__(self, redis_port, workdir, *extra, prefix=None):
        self.port = free_port()
        self.log = open(os.path.join(workdir, f"baton-{self.port}.log"), "wb")
        self.proc = subprocess.Popen(
            [os.environ["BATON_BIN"], "serve", "--listen", f"127.0.0.1:{self.port}",
             "--redis-url", f"redis://127.0.0.1:{redis_port}",
             "--key-prefix", prefix or f"py-{uuid.uuid4().hex[:8]}:",
             # 2 s per Redis call unless a test says otherwise: on a loaded machine 400 ms
             # failed calls of the contract tests UNAVAILABLE (a killed Redis still fails at once).
             *([] if "--redis-command-timeout" in extra else ["--redis-command-timeout", "2s"]),
             *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        health = health_pb2_grpc.HealthStub(self.channel)
        wait_until("Baton readiness SERVING", lambda: health.Check(
            health_pb2.HealthCheckRequest(service="readiness"), timeout=1).status
            == health_pb2.HealthCheckResponse.SERVING)

    def stop(self):
        """SIGTERM, then waits for the drain to finish."""
        self.channel.close()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=15)
        self.log.close()
