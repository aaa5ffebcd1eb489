#!/usr/bin/env bash
# Counts the system calls a Baton process makes per gRPC call under load: the load generator runs
# one unary scenario against each given build (fresh Redis and Baton each), and `perf stat` counts
# Baton's write, read and wait system calls for 3 s in the middle of the measured window; each
# count is divided by the calls the window served in those 3 s (its calls per second times 3).
# Needs `perf` (Debian's linux-perf) and the release builds of baton and loadgen.
#
#   scripts/syscalls-per-call.sh SCENARIO CLIENTS TRANSPORT NAME=BATON [NAME=BATON...]
#   scripts/syscalls-per-call.sh lock 64 tcp before=/path/to/old/baton after=target/release/baton
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 4 ]; then
  sed -n '2,9p' "$0" >&2
  exit 2
fi
scenario=$1 clients=$2 transport=$3
shift 3
events=syscalls:sys_enter_writev,syscalls:sys_enter_write,syscalls:sys_enter_sendto,syscalls:sys_enter_recvfrom,syscalls:sys_enter_read,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

for build in "$@"; do
  name=${build%%=*} baton=$(realpath "${build#*=}")
  target/release/loadgen run --scenario "$scenario" --clients "$clients" --transport "$transport" \
    --repeat 1 --seconds 8 --warmup 0.5 --baton "$name=$baton" --out "$scratch/$name.json" \
    >"$scratch/$name.log" 2>&1 &
  loadgen=$!
  pid=
  for _ in $(seq 1 200); do
    pid=$(pgrep -P "$loadgen" -f "^$baton serve" | head -1 || true)
    [ -n "$pid" ] && break
    sleep 0.05
  done
  [ -n "$pid" ] || { echo "no Baton process for $name" >&2; cat "$scratch/$name.log" >&2; exit 1; }
  # The direct side runs first; Baton's window starts when its CPU time starts climbing.
  ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
  before=$(ticks)
  while sleep 0.3; do
    now=$(ticks)
    [ $((now - before)) -gt 8 ] && break
    before=$now
  done
  sleep 1
  perf stat -x, -e "$events" -p "$pid" -- sleep 3 2>"$scratch/$name.perf"
  wait "$loadgen"
  python3 - "$scratch/$name.json" "$scratch/$name.perf" "$name" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))
r = next(r for r in run["records"] if r["side"].startswith("baton-"))["values"]
rate = r["calls"] / r["secs"]
counts = {}
for line in open(sys.argv[2]):
    f = line.split(",")
    if len(f) > 3 and f[2].startswith("syscalls:sys_enter_"):
        counts[f[2].removeprefix("syscalls:sys_enter_")] = float(f[0]) / (rate * 3)
print(f"{sys.argv[3]}: {rate:.0f} calls/s, Baton CPU {r['baton_cpu_s'] * 1e6 / r['calls']:.1f} µs/call; "
      + ", ".join(f"{k} {v:.2f}" for k, v in counts.items()) + " per call")
PY
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
