#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, clippy, buf lint, the contract checked from a
# generated Python client, the Python and Node client packages, then every Rust test (unit and
# integration, the command-line client's included). Every test starts its own
# redis-server processes on free ports and stops them by pid.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh --with-buf

echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy"
cargo clippy --locked --all-targets -- -D warnings
echo "==> buf lint"
.tools/node_modules/.bin/buf lint
echo "==> Python tests: the contract from a generated client, the Helm chart, the image"
scripts/python-tests.sh
echo "==> client packages (clients/python, clients/node)"
scripts/client-tests.sh
echo "==> cargo test"
cargo test --locked --all-targets
echo "==> the service suites again, against a local 3-master Redis Cluster"
BATON_TEST_TOPOLOGY=cluster cargo test --locked --test lock --test semaphore --test election --test autocomplete --test ratelimit
