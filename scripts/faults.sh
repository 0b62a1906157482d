#!/usr/bin/env bash
# The fault suite (issue 11): starts (or reuses) the local services, builds the release
# `worker-host` and the `worker-faults` harness, and runs the scenarios against the real
# services. Prints the table and writes docs/RELIABILITY.md; exits non-zero if a scenario fails.
#
#   scripts/faults.sh                          every scenario at its full load (long)
#   scripts/faults.sh --quick                  each once with a small load
#   scripts/faults.sh --scenario host-kill9    only that one (repeatable)
#   scripts/faults.sh --baseline-messages 1000 --repetitions 5   smaller full run
#   scripts/faults.sh --disruptive             also pg-restart (it restarts the shared
#                                              PostgreSQL; the broker's process faults run on a
#                                              private RabbitMQ node the scenarios start)
#   scripts/faults.sh --output -               print only, write no document
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

start=$(date +%s)
scripts/services.sh up
eval "$(scripts/services.sh env)"

echo "faults: building the release worker-host and the harness"
cargo build --release --locked -p worker-host
cargo build --release --locked -p worker-faults

status=0
target/release/worker-faults --host-bin target/release/worker-host "$@" || status=$?
echo "faults: done in $(( $(date +%s) - start )) s"
exit $status
