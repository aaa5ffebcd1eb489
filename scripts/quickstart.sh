#!/usr/bin/env bash
# Quick start: install what is missing, start a private Redis (no persistence, on a Unix socket in
# .quickstart/, so it clashes with nothing), and run Baton against it in the foreground on
# 127.0.0.1:50051 and .quickstart/baton.sock. Ctrl-C stops Baton (draining) and then Redis.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cargo build --release --locked

dir="$PWD/.quickstart"
mkdir -p "$dir"
rm -f "$dir/redis.sock" "$dir/redis.pid"
redis-server --port 0 --unixsocket "$dir/redis.sock" --unixsocketperm 600 \
  --save "" --appendonly no --dir "$dir" --logfile "$dir/redis.log" \
  --pidfile "$dir/redis.pid" --daemonize yes

stop_redis() {
  if [ -f "$dir/redis.pid" ]; then
    kill "$(cat "$dir/redis.pid")" 2>/dev/null || true
    rm -f "$dir/redis.pid"
  fi
}
trap stop_redis EXIT

for _ in $(seq 1 100); do
  redis-cli -s "$dir/redis.sock" ping >/dev/null 2>&1 && break
  sleep 0.05
done
redis-cli -s "$dir/redis.sock" ping >/dev/null || { cat "$dir/redis.log"; exit 1; }

echo "==> Redis on $dir/redis.sock; starting Baton (Ctrl-C to stop)"
BATON_SOCKET="${BATON_SOCKET:-$dir/baton.sock}" \
  target/release/baton serve --redis-url "unix://$dir/redis.sock" "$@"
