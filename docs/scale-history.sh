#!/usr/bin/env bash
# What the console's history costs in rows and bytes for a week of a busy installation
# (docs/scale-history.sql: 7 jobs, 10 queues and the outbox, every minute for 7 days): a fresh
# database gets the history's tables, the week is seeded, the minutes past 2 days are swept,
# and each table's rows and pg_total_relation_size are printed. The database is dropped at
# the end.
#
#   docs/scale-history.sh
#
# Needs the local PostgreSQL (scripts/services.sh up).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
db=wh_scale_history
server=${SERVER:-postgres://worker_host:worker_host@127.0.0.1:5432}
export PGOPTIONS='-c client_min_messages=error'

psql "$server/postgres" -qX -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
trap 'psql "$server/postgres" -qX -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"' EXIT
psql "$server/$db" -qX -v ON_ERROR_STOP=1 -f migrations/20261207000100_history.sql
started=$(date +%s)
psql "$server/$db" -qX -v ON_ERROR_STOP=1 -f docs/scale-history.sql
echo "in $(($(date +%s) - started)) s"
