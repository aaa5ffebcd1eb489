#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, the crate's documentation, buf lint, then one
# build of every workspace target with clippy's lints denied; then, side by side
# (scripts/run-tests.py), every Rust test executable of the workspace (unit and integration, the
# command-line client's, the test harness's and the load generator's smoke runs included), the
# service suites again against a Redis Cluster, and, one after another in one part, the contract
# checked from a generated Python client, the Helm chart, the Python and Node client packages
# and, as root, the image. Every test starts its own redis-server processes on free ports and
# stops them by pid.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's header says how long the suite has run, so a slow step shows in CI's log.
step() { echo "==> $* (at ${SECONDS} s)"; }

# Everything the later steps need (Redis, buf, the Python tools, buildah, Node), installed while
# the documentation compiles: the downloads need little of the CPU the compiler wants.
mkdir -p target
scripts/install-deps.sh --with-buf --with-python --with-buildah >target/install-deps.log 2>&1 &
deps=$!
trap 'kill "$deps" 2>/dev/null || true' EXIT
installed() {
  local code=0
  wait "$deps" || code=$?
  cat target/install-deps.log
  if [ "$code" -ne 0 ]; then
    echo "scripts/install-deps.sh failed (exit $code)" >&2
    exit 1
  fi
}

# Clippy lints the workspace's crates while they are compiled for the tests, as the compiler
# driver cargo runs for them (what `cargo clippy` does, with `cargo check` instead of a build):
# the dependencies are compiled once, not checked once for clippy and compiled again for the
# tests. `-D warnings` denies clippy's warnings and the compiler's in the workspace's crates only
# (cargo caps the lints of dependencies). Every cargo command below, the scripts' included, runs
# with these variables, so none compiles anything again.
export RUSTC_WORKSPACE_WRAPPER
RUSTC_WORKSPACE_WRAPPER="$(rustc --print sysroot)/bin/clippy-driver"
export RUSTFLAGS="-D warnings"
# A build from scratch gains nothing from incremental compilation's caches, and saving them cost a
# fifth of the test build's CPU (353 s against 280 s for `cargo test --no-run` on 2 cores).
export CARGO_INCREMENTAL=0
if ! "$RUSTC_WORKSPACE_WRAPPER" --version >/dev/null 2>&1; then
  RUSTC_WORKSPACE_WRAPPER=$(command -v clippy-driver) \
    || { echo "clippy is missing: rustup component add clippy" >&2; exit 1; }
fi

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo doc (the crate's documentation builds without warnings: links resolve)"
RUSTDOCFLAGS="-D warnings" cargo doc --locked --no-deps -p baton
step "cargo test --no-run, with clippy's lints (every workspace target, one feature set)"
cargo test --locked --workspace --all-targets --no-run --message-format=json-render-diagnostics \
  >target/test-executables.json

# The image test packs the binary the tests ran (as the Dockerfile packs the release binary:
# stripped, with the shared libraries it maps); its size budget is the release binary's, checked
# by `scripts/python-tests.sh` (which builds that binary) run as root.
image=true
if [ "$(id -u)" -eq 0 ] || [ -n "${CI:-}" ]; then
  image="BATON_IMAGE_BIN=$PWD/target/debug/baton BATON_PY_GEN=$PWD/.tools/py-gen \
.tools/py/bin/python -m unittest discover -s tests/python -p test_image.py -v"
fi
step "the installs started at the beginning (scripts/install-deps.sh)"
installed
step "buf lint"
.tools/node_modules/.bin/buf lint
step "the tests, side by side (scripts/run-tests.py)"
scripts="Python contract tests, Helm chart, client packages, image"
# Two parts at a time on the 2-core CI machine, one at a time when other work keeps its CPUs
# busy; the load tests of failover/ (3,000 leases renewed on a Cluster) and soak.rs (1,000
# streams) run alone, the rest of failover/ (which mostly waits on failovers) beside the others.
# BATON_TEST_LANES sets the count. The script part (Python, Helm, Envoy, the client packages)
# mostly waits on the processes it starts (half a CPU over its 280 s): it runs in a lane of its
# own beside the two. The two autocomplete tests that count each write script's work
# and read Redis's slow log (a minute together) run on one Redis only: their figures do not depend
# on the topology, and the Cluster run covers the same scripts.
.tools/py/bin/python scripts/run-tests.py --lanes "${BATON_TEST_LANES:-auto}" \
  --cluster lock semaphore election autocomplete ratelimit \
  --not-on-cluster autocomplete=writes::write_steps_stay_within_their_work_budget \
  --not-on-cluster autocomplete=writes::steps_of_fresh_words_hold_redis_as_briefly_as_others \
  --alone failover=keepalive::cluster_keepalive_cost_per_node soak \
  --beside "$scripts" \
  --script "$scripts=scripts/python-tests.sh --no-image && scripts/client-tests.sh && $image" \
  <target/test-executables.json
step "done"
