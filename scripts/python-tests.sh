#!/usr/bin/env bash
# Checks the services' contracts from Python, through a client generated from proto/ with
# grpcio-tools: the way an application in another language sees Baton; then the Helm chart
# (rendered, validated and run) and, as root, the image. Installs the Python tools into a
# virtualenv under .tools/ when missing (scripts/install-deps.sh); builds the binaries the tests
# start.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.tools/py
scripts/install-deps.sh --with-python --with-buildah

gen=.tools/py-gen
rm -rf "$gen" && mkdir -p "$gen"
"$venv/bin/python" -m grpc_tools.protoc -I proto --python_out="$gen" --grpc_python_out="$gen" \
  proto/baton/v1/*.proto

# The binary as the test suite builds it (every workspace target, one feature set), so that
# scripts/test.sh compiles the dependencies once for this and for `cargo test`.
cargo build --locked --workspace --all-targets
# The image test (root only, as CI runs) packs the release binary, as the Dockerfile does; with
# --no-image it is left to the caller (scripts/test.sh runs it on the debug binary, without the
# release binary's size budget).
release=()
if [ "${1:-}" != "--no-image" ] && { [ "$(id -u)" -eq 0 ] || [ -n "${CI:-}" ]; }; then
  echo "==> cargo build --release (for the image test)"
  cargo build --locked --release --bin baton
  release=(BATON_RELEASE_BIN="$PWD/target/release/baton")
fi
env BATON_BIN="$PWD/target/debug/baton" "${release[@]}" BATON_PY_GEN="$PWD/$gen" \
  "$venv/bin/python" -m unittest discover -s tests/python -p 'test_*.py' -v
