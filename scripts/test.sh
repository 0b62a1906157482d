#!/usr/bin/env bash
# The whole test suite: starts (or reuses) the local services, then checks formatting and
# lints and runs every test of the workspace against the real services on loopback.
#
#   scripts/test.sh                 everything (what CI runs)
#   scripts/test.sh -p worker-core  extra arguments go to `cargo test`
#   WH_SKIP_LINT=1 scripts/test.sh  skip `cargo fmt --check` and clippy
#   WH_SKIP_FAULTS=1 scripts/test.sh  skip the fault suite's quick run (it runs only when no
#                                   extra arguments narrow the tests)
#
# Before the tests it installs the deployment tools (scripts/deploy-tools.sh: podman, runc,
# debootstrap, podman-compose, prometheus, cargo-deb, npm), installs axe-core from the npm
# registry for the console's accessibility test, and builds what the deployment tests
# run: the fault-injection host, the image (scripts/image.sh, from the debug binary, on a base
# made from Debian's packages where no registry answers) and the package (scripts/package.sh).
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

echo "test: the deployment artefacts (scripts/deploy-tools.sh, image.sh, package.sh)"
scripts/deploy-tools.sh
echo "test: axe-core for the console's accessibility test (npm ci, crates/testkit/axe)"
npm ci --prefix crates/testkit/axe --no-audit --no-fund --loglevel=error
# The fault-injection build (x-fault-inject: panic and wedge), for the notify test's wedged
# handler and the fault suite; a copy of its own, since the plain build below replaces it.
cargo build --locked -p worker-host --features fault-injection
cp target/debug/worker-host target/debug/worker-host-fault-injection
export WH_TEST_FAULT_INJECTION_HOST=$PWD/target/debug/worker-host-fault-injection
# The host binary as `cargo test --workspace` builds it (dev-dependency features make it
# differ from `cargo build`'s), so that the image and the package hold the binary under test
# and the test run below compiles nothing more. CI packages this debug binary; the release
# image and package are `scripts/image.sh` and `scripts/package.sh` without --binary.
cargo test --workspace --locked --no-run
eval "$(scripts/image.sh --binary target/debug/worker-host --tag localhost/worker-host:test --print-env)"
eval "$(scripts/package.sh --binary target/debug/worker-host --fast --output target/debian-test --print-env)"

echo "test: cargo test"
cargo test --workspace --locked --no-fail-fast "$@"

if [ $# -eq 0 ] && [ "${WH_SKIP_FAULTS:-0}" != 1 ]; then
    echo "test: the fault suite, quick (scripts/faults.sh --quick)"
    scripts/faults.sh --quick
fi
echo "test: done in $(( $(date +%s) - start )) s"
