#!/usr/bin/env bash
# The fault suite (issue 11): starts (or reuses) the local services, builds the release
# `worker-host` and the `worker-faults` harness, and runs the scenarios against the real
# services. Prints the table and writes docs/RELIABILITY.md; exits non-zero if a scenario fails.
#
#   scripts/faults.sh                          every scenario at its full load (long)
#   scripts/faults.sh --quick                  each once with a small load, 6 at a time, on
#                                              the debug binary (what CI runs after the tests);
#                                              rabbit-cluster-node-stop and rolling-upgrade
#                                              only when named (rolling-upgrade builds the
#                                              commit docs/previous-release names, minutes
#                                              when cold, log under
#                                              target/faults/previous-release/<commit>/)
#   scripts/faults.sh --scenario host-kill9    only that one (repeatable)
#   scripts/faults.sh --baseline-messages 1000 --repetitions 5   smaller full run
#   scripts/faults.sh --output -               print only, write no document (the full run
#                                              writes docs/RELIABILITY.md, --quick
#                                              target/faults/quick.md)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

start=$(date +%s)
scripts/services.sh up
eval "$(scripts/services.sh env)"

# The full run measures the release binary; --quick (CI, after the test suite) the debug one,
# whose dependencies the test suite has just built, so that it costs no second build.
profile=release
for arg in "$@"; do [ "$arg" = --quick ] && profile=debug; done
build=(--locked)
[ "$profile" = release ] && build+=(--release)
echo "faults: building the $profile worker-host, one with its fault-injection hook, and the harness"
# poison-panic needs a handler that panics on demand: a hook only a `fault-injection` build
# has. It gets a copy of its own; every other scenario measures the plain binary.
cargo build "${build[@]}" -p worker-host --features fault-injection
cp "target/$profile/worker-host" "target/$profile/worker-host-fault-injection"
cargo build "${build[@]}" -p worker-host
cargo build "${build[@]}" -p worker-faults

status=0
"target/$profile/worker-faults" --host-bin "target/$profile/worker-host" \
    --fault-injection-host-bin "target/$profile/worker-host-fault-injection" "$@" || status=$?
echo "faults: done in $(( $(date +%s) - start )) s"
exit $status
