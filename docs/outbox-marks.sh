#!/usr/bin/env bash
# What settling the outbox drain's published rows costs PostgreSQL: 20,000 rows of ~1 KiB
# with the outbox's indexes, claimed 500 at a time (FOR UPDATE SKIP LOCKED) and then marked
# processed, deleted, or either with a row each recorded in a publications table in the same
# statement (`mark + record`: what the drain did until it deleted them; `delete + record`: what
# it does now, `WITH gone AS (DELETE ... RETURNING ...) INSERT INTO publications ...`); or read
# 500 at a time with no lock and no settle. Prints the time of each, twice, alternating. Needs the local services (scripts/services.sh up); it works in a
# scratch table `outbox_marks_bench` of the shared database and drops it at the end.
#
#   docs/outbox-marks.sh
set -euo pipefail
url=${WH_TEST_DATABASE_URL:-postgres://worker_host:worker_host@127.0.0.1:5432/worker_host}
sql() { psql "$url" -qX "$@"; }

fill() {
    sql <<'SQL' >/dev/null
SET client_min_messages = warning;
DROP TABLE IF EXISTS outbox_marks_bench;
CREATE TABLE outbox_marks_bench (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    status text NOT NULL DEFAULT 'pending',
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    processed_at timestamptz,
    attempts int NOT NULL DEFAULT 0,
    message_id text NOT NULL,
    headers jsonb NOT NULL,
    body bytea NOT NULL);
CREATE INDEX ON outbox_marks_bench (id) INCLUDE (next_attempt_at) WHERE status = 'pending';
CREATE INDEX ON outbox_marks_bench (processed_at) WHERE status = 'processed';
CREATE INDEX ON outbox_marks_bench (message_id) WHERE status = 'pending';
INSERT INTO outbox_marks_bench (message_id, headers, body)
SELECT 'm' || g, '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}',
       convert_to(repeat('x', 1000) || g, 'UTF8')
FROM generate_series(1, 20000) g;
VACUUM ANALYZE outbox_marks_bench;
DROP TABLE IF EXISTS outbox_marks_bench_publications;
CREATE TABLE outbox_marks_bench_publications (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id text NOT NULL,
    published_at timestamptz NOT NULL,
    trace_id text);
CREATE INDEX ON outbox_marks_bench_publications (message_id);
SQL
}

# 40 batches of 500: `lock` is how the claim locks its rows, `settle` what follows it.
batches() {
    local lock=$1 settle=$2
    for i in $(seq 0 39); do
        cat <<SQL
BEGIN;
SELECT array_agg(id) AS ids FROM (
    SELECT id, message_id, headers, body, attempts FROM outbox_marks_bench
    WHERE status = 'pending' AND next_attempt_at <= now() AND id > $((i * 500))
    ORDER BY id LIMIT 500 $lock) claimed \gset
$settle
COMMIT;
SQL
    done
}

claim="FOR UPDATE SKIP LOCKED"
read_lock="" read="" read_label="read only"
mark_lock=$claim delete_lock=$claim record_lock=$claim markrec_lock=$claim
mark_label="claim + mark" delete_label="claim + delete" record_label="delete + record"
markrec_label="mark + record"
mark="UPDATE outbox_marks_bench SET status = 'processed', processed_at = now() WHERE id = ANY(:'ids') AND status = 'pending';"
delete="DELETE FROM outbox_marks_bench WHERE id = ANY(:'ids');"
record="WITH gone AS (DELETE FROM outbox_marks_bench WHERE id = ANY(:'ids') AND status = 'pending' RETURNING message_id, headers ->> 'traceparent' AS tp) INSERT INTO outbox_marks_bench_publications (message_id, published_at, trace_id) SELECT message_id, now(), NULLIF(split_part(tp, '-', 2), '') FROM gone;"
markrec="WITH marked AS (UPDATE outbox_marks_bench SET status = 'processed', processed_at = now() WHERE id = ANY(:'ids') AND status = 'pending' RETURNING message_id, processed_at, headers ->> 'traceparent' AS tp) INSERT INTO outbox_marks_bench_publications (message_id, published_at, trace_id) SELECT message_id, processed_at, NULLIF(split_part(tp, '-', 2), '') FROM marked;"
for round in 1 2; do
    for way in read mark delete markrec record; do
        fill
        lock=${way}_lock label=${way}_label
        script=$(batches "${!lock}" "${!way}")
        started=$(date +%s%N)
        sql <<<"$script" >/dev/null
        ended=$(date +%s%N)
        printf 'round %d: %-15s %5d ms for 20000 rows\n' "$round" "${!label}" $(((ended - started) / 1000000))
    done
done
sql -c 'DROP TABLE outbox_marks_bench, outbox_marks_bench_publications' >/dev/null
