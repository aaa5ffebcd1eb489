#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, clippy, buf lint, the contract checked from a
# generated Python client, the Python and Node client packages, then every Rust test of the
# workspace (unit and integration, the command-line client's, the test harness's and the load
# generator's smoke runs included). Every test starts its own
# redis-server processes on free ports and stops them by pid.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's header says how long the suite has run, so a slow step shows in CI's log.
step() { echo "==> $* (at ${SECONDS} s)"; }

scripts/install-deps.sh --with-buf

# The image test (root only, as CI runs) packs a release binary: it compiles at the lowest CPU
# priority while the other steps run (in a target directory of its own, so no build waits for
# another's lock), and the test runs last.
image_build=
if [ "$(id -u)" -eq 0 ] || [ -n "${CI:-}" ]; then
  mkdir -p target
  nice -n 19 cargo build --locked --release --bin baton --target-dir target/image \
    >target/image-build.log 2>&1 &
  image_build=$!
  trap 'kill "$image_build" 2>/dev/null || true' EXIT
fi

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy"
cargo clippy --locked --workspace --all-targets -- -D warnings
step "cargo doc (the crate's documentation builds without warnings: links resolve)"
RUSTDOCFLAGS="-D warnings" cargo doc --locked --no-deps -p baton
step "buf lint"
.tools/node_modules/.bin/buf lint
step "Python tests: the contract from a generated client, the Helm chart, the image"
scripts/python-tests.sh --no-image
step "client packages (clients/python, clients/node)"
scripts/client-tests.sh
step "cargo test (the load generator's smoke runs included: tools/loadgen/tests/smoke.rs)"
cargo test --locked --workspace --all-targets
step "the service suites again, against a local 3-master Redis Cluster"
# --workspace keeps the feature set of the run above, so nothing is compiled again.
BATON_TEST_TOPOLOGY=cluster cargo test --locked --workspace --test lock --test semaphore --test election --test autocomplete --test ratelimit
if [ -n "$image_build" ]; then
  step "the image, from the release binary built meanwhile"
  if ! wait "$image_build"; then
    cat target/image-build.log
    exit 1
  fi
  BATON_RELEASE_BIN="$PWD/target/image/release/baton" BATON_PY_GEN="$PWD/.tools/py-gen" \
    .tools/py/bin/python -m unittest discover -s tests/python -p 'test_image.py' -v
fi
step "done"
