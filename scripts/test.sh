#!/usr/bin/env bash
# The whole test suite: starts (or reuses) the local services, then checks formatting and
# lints and runs every test of the workspace against the real services on loopback.
#
#   scripts/test.sh                 everything (what CI runs)
#   scripts/test.sh -p worker-core  extra arguments go to `cargo test`
#   WH_SKIP_LINT=1 scripts/test.sh  skip `cargo fmt --check` and clippy
#   WH_SKIP_FAULTS=1 scripts/test.sh  skip the fault suite's quick run (it runs only when no
#                                   extra arguments narrow the tests)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

start=$(date +%s)
scripts/services.sh up
eval "$(scripts/services.sh env)"

if [ "${WH_SKIP_LINT:-0}" != 1 ]; then
    echo "test: cargo fmt --check"
    cargo fmt --all --check
    echo "test: cargo clippy"
    cargo clippy --workspace --all-targets --locked -- -D warnings
    # The fault suite's hook (poison-panic) is compiled only with this feature.
    cargo clippy -p worker-broker --all-targets --features fault-injection --locked -- -D warnings
fi

echo "test: cargo test"
cargo test --workspace --locked --no-fail-fast "$@"

if [ $# -eq 0 ] && [ "${WH_SKIP_FAULTS:-0}" != 1 ]; then
    echo "test: the fault suite, quick (scripts/faults.sh --quick)"
    scripts/faults.sh --quick
fi
echo "test: done in $(( $(date +%s) - start )) s"
