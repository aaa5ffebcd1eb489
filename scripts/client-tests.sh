#!/usr/bin/env bash
# Builds the client packages and tests them against live Batons (the real binary, a private
# redis-server): clients/python with pytest (blocking and asyncio), clients/node with Node's own
# test runner. Their dependencies come from PyPI and the npm registry, installed into .tools/py
# and clients/node/node_modules.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --locked --bin baton
export BATON_BIN="$PWD/target/debug/baton"

echo "==> Python package (clients/python)"
venv=.tools/py
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import grpc_tools, grpc_health, pytest, pytest_asyncio, setuptools, google.rpc.status_pb2" 2>/dev/null; then
  "$venv/bin/pip" install -q --disable-pip-version-check \
    "setuptools>=68" "grpcio-tools>=1.70,<2" "grpcio-health-checking>=1.70,<2" \
    "googleapis-common-protos>=1.66,<2" "pytest>=8" "pytest-asyncio>=0.24"
fi
# Built like any install (setup.py runs grpcio-tools on proto/), with the build tools above.
"$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation --force-reinstall \
  --no-deps ./clients/python
(cd clients/python && "$OLDPWD/$venv/bin/python" -m pytest -p no:cacheprovider -q tests)

echo "==> Node package (clients/node)"
# The Node that scripts/install-deps.sh installed when the machine's was older than 20.
if [ -x .tools/node/bin/node ]; then
  export PATH="$PWD/.tools/node/bin:$PATH"
fi
# `npm install` rather than `npm ci`: it installs what package-lock.json pins as well, but does
# not refuse a lock that lacks the other platforms' optional buf binaries (npm records only the
# platform it ran on).
(cd clients/node && npm install --no-audit --no-fund --loglevel=error && npm test)
