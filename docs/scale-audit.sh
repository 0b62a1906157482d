#!/usr/bin/env bash
# How the host's statements cost once the tables hold a week of a busy installation's traffic
# (docs/scale-seed.sql): a fresh database is migrated and seeded, the host runs on it for
# SECONDS (default 60) with every timer job ticking every 10 s, the console's pages are timed,
# and, where PostgreSQL has pg_stat_statements loaded (see docs/SCALING.md), every statement
# whose mean is over 1 ms is listed. The database is dropped at the end.
#
#   docs/scale-audit.sh [SECONDS]
#
# Needs the local services (scripts/services.sh up) and a built host (HOST_BIN, by default
# target/release/worker-host). Run as root to read pg_stat_statements.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${1:-60}
db=wh_scale_audit
server=postgres://worker_host:worker_host@127.0.0.1:5432
host_bin=${HOST_BIN:-target/release/worker-host}
admin=127.0.0.1:9181
export PGOPTIONS='-c client_min_messages=error'

psql "$server/postgres" -qX -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
export WORKER_HOST__DATABASE__NAME=$db WORKER_HOST__ADMIN__LISTEN=$admin
"$host_bin" migrate >/dev/null 2>&1
started=$(date +%s)
psql "$server/$db" -qX -v ON_ERROR_STOP=1 -f docs/scale-seed.sql
echo "seeded in $(($(date +%s) - started)) s"

statements=no
if [ "$(id -u)" = 0 ] &&
    su postgres -c "psql -AtX -c 'show shared_preload_libraries'" | grep -q pg_stat_statements; then
    su postgres -c "psql -qX -d $db -c 'CREATE EXTENSION IF NOT EXISTS pg_stat_statements' -c 'SELECT pg_stat_statements_reset()'" >/dev/null
    statements=yes
fi

log=$(mktemp)
for job in RETENTION RECONCILER DRAFT_EXPIRY DEAD_LETTER_ARCHIVE; do
    export "WORKER_HOST__JOBS__${job}__SCHEDULE=every 10s"
done
"$host_bin" run >"$log" 2>&1 &
host=$!
trap 'kill -TERM $host 2>/dev/null || true; wait $host 2>/dev/null || true' EXIT
for _ in $(seq 1 60); do
    curl -fs -o /dev/null "http://$admin/readyz" && break
    sleep 0.5
done

echo "console pages, slowest of 3 (seconds):"
for page in / /dead-letters "/dead-letters?search=no+such+user" /dead-letters/messages \
    "/dead-letters/messages?queue=email.send&reason=rejected" /jobs/retention /outbox /actions; do
    slowest=$(for _ in 1 2 3; do
        curl -s -o /dev/null -w '%{time_total}\n' "http://$admin$page"
    done | sort -n | tail -1)
    printf '  %-58s %s\n' "$page" "$slowest"
done
sleep "$seconds"
kill -TERM $host
wait $host || true
trap - EXIT
echo "warnings in the host's log: $(grep -c 'WARN' "$log" || true)"
{ grep 'WARN' "$log" || true; } | sed 's/\x1b\[[0-9;]*m//g' | cut -c 1-200 | sort | uniq -c | sort -rn | head -5
rm -f "$log"

if [ $statements = yes ]; then
    echo "statements over 1 ms on average:"
    su postgres -c "psql -X -P pager=off -d $db -c \"SELECT calls, round(mean_exec_time::numeric, 1) AS mean_ms, round(max_exec_time::numeric, 1) AS max_ms, left(regexp_replace(query, '\\s+', ' ', 'g'), 110) AS statement FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND mean_exec_time > 1 AND query NOT LIKE '%pg_sleep%' ORDER BY mean_exec_time DESC\""
else
    echo "(pg_stat_statements is not loaded: no statement figures)"
fi
psql "$server/postgres" -qX -c "DROP DATABASE $db WITH (FORCE)"
