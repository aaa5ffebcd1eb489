#!/usr/bin/env bash
# Installs what Baton's scripts need and a fresh machine lacks: redis-server (Debian package) for
# the quick start and the tests, promtool (extracted from Debian's prometheus package into
# .tools/prometheus/, without installing or starting a Prometheus service) for the metrics tests,
# and buf (npm package @bufbuild/buf, into .tools/) for proto lint.
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

with_buf=false
for arg in "$@"; do
  case "$arg" in
    --with-buf) with_buf=true ;;
    *) echo "usage: $0 [--with-buf]" >&2; exit 2 ;;
  esac
done

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "==> installing redis-server (apt-get)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  # The package starts a system Redis on 6379; Baton's scripts and tests never use it.
fi

if ! command -v promtool >/dev/null 2>&1 && [ ! -x .tools/prometheus/usr/bin/promtool ]; then
  echo "==> extracting promtool (apt-get download prometheus) into .tools/prometheus/"
  mkdir -p .tools/prometheus
  downloads=$(mktemp -d)
  chmod 0777 "$downloads"  # apt drops root to download into it
  if ! (cd "$downloads" && apt-get download prometheus >/dev/null 2>&1); then
    as_root apt-get update -qq
    (cd "$downloads" && apt-get download prometheus >/dev/null)
  fi
  dpkg -x "$downloads"/prometheus_*.deb "$downloads/root"
  cp "$downloads/root/usr/bin/promtool" .tools/prometheus/promtool.tmp
  mkdir -p .tools/prometheus/usr/bin
  mv .tools/prometheus/promtool.tmp .tools/prometheus/usr/bin/promtool
  rm -rf "$downloads"
fi

if $with_buf && [ ! -x .tools/node_modules/.bin/buf ]; then
  echo "==> installing buf (npm @bufbuild/buf into .tools/)"
  mkdir -p .tools
  npm install --prefix .tools --no-save --no-audit --no-fund --loglevel=error @bufbuild/buf@1 >/dev/null
fi
