#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, clippy, buf lint, then every test (unit and
# integration; the integration tests start their own redis-server processes on free ports).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh --with-buf

echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy"
cargo clippy --locked --all-targets -- -D warnings
echo "==> buf lint"
.tools/node_modules/.bin/buf lint
echo "==> cargo test"
cargo test --locked --all-targets
