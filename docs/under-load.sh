#!/usr/bin/env bash
# Runs a command as a loaded machine would: pinned to core 0 beside $BUSY busy loops (default
# 1) also pinned there, at normal priority, so the command gets at most about 1/(BUSY+1) of one
# core. Stops only the loops it started. Issue 38 (finding 10) made the shutdown test's
# failure on a fresh machine repeatable with it:
#
#   eval "$(scripts/services.sh env)"
#   cargo test -p worker-host --test shutdown --no-run     # prints the test binary's path
#   BUSY=3 docs/under-load.sh target/debug/deps/shutdown-<hash> --nocapture
#
# Before the test's wait followed progress, 2 runs of 3 failed this way ("every event handled
# or dead: not within 60s" while the host was still handling ~50 events a second); after, 3 of
# 3 passed, draining in 124-146 s.
set -u
BUSY=${BUSY:-1}
pids=()
for _ in $(seq "$BUSY"); do
    taskset -c 0 sh -c 'while :; do :; done' &
    pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
taskset -c 0 "$@"
