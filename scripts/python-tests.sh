#!/usr/bin/env bash
# Checks the services' contracts from Python, through a client generated from proto/ with
# grpcio-tools: the way an application in another language sees Baton. Installs grpcio into a
# virtualenv under .tools/ when missing; builds the baton binary the tests start.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.tools/py
if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating $venv with grpcio"
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import grpc_tools, grpc_health, grpc_reflection" 2>/dev/null; then
  "$venv/bin/pip" install -q --disable-pip-version-check \
    "grpcio>=1.70,<2" "grpcio-tools>=1.70,<2" "grpcio-health-checking>=1.70,<2" "grpcio-reflection>=1.70,<2"
fi

gen=.tools/py-gen
rm -rf "$gen" && mkdir -p "$gen"
"$venv/bin/python" -m grpc_tools.protoc -I proto --python_out="$gen" --grpc_python_out="$gen" \
  proto/baton/v1/*.proto

cargo build --locked --bin baton
BATON_BIN="$PWD/target/debug/baton" BATON_PY_GEN="$PWD/$gen" \
  "$venv/bin/python" -m unittest discover -s tests/python -p 'test_*.py' -v
