-- A week of a busy installation's history, for docs/scale-history.sh: 7 jobs and 10 queues
-- (each with 3 retry tiers) and the outbox, a row each every minute for 7 days, as the
-- replicas' flushes and the lease holder's gauges write them, with the hours and days the
-- rollups make. Then the retention job's sweep of the minutes (kept 2 days). Run on a
-- database with the history's tables (migrations/20261207000100_history.sql).
\set days 7
CREATE TEMP TABLE series AS
SELECT 'job' AS series, j AS name FROM unnest(ARRAY['automation-trigger', 'automation-action',
    'email-send', 'outbox-drain', 'inbound-email-poller', 'draft-expiry', 'db-health']) AS j
UNION ALL SELECT 'queue', 'queue-' || q FROM generate_series(1, 10) AS q
UNION ALL SELECT 'outbox', 'outbox';

CREATE TEMP TABLE periods (resolution text, at timestamptz);
INSERT INTO periods SELECT 'minute', g FROM generate_series(
    date_trunc('minute', now()) - make_interval(days => :days), date_trunc('minute', now()),
    interval '1 minute') AS g;
INSERT INTO periods SELECT 'hour', g FROM generate_series(
    date_trunc('hour', now()) - make_interval(days => :days), date_trunc('hour', now()),
    interval '1 hour') AS g;
INSERT INTO periods SELECT 'day', g FROM generate_series(
    date_trunc('day', now()) - make_interval(days => :days), date_trunc('day', now()),
    interval '1 day') AS g;

-- A job's row: units, two or three failure reasons, 18 duration buckets. A queue's: ready,
-- three tiers, dead letters. The outbox's: backlog and oldest row.
CREATE TEMP VIEW seeded AS
SELECT p.resolution, s.series, s.name, p.at,
       CASE WHEN s.series = 'job' THEN 600 + (random() * 400)::int ELSE 0 END AS units,
       CASE WHEN s.series = 'job' THEN jsonb_build_object(
           'parked:transient', (random() * 20)::int,
           'dead-lettered:gave-up', (random() * 2)::int,
           'parked:throttled', (random() * 5)::int) ELSE '{}'::jsonb END AS failures,
       CASE WHEN s.series = 'job' THEN ARRAY(SELECT (random() * 200)::bigint FROM generate_series(1, 18))
            ELSE '{}'::bigint[] END AS durations,
       CASE WHEN s.series = 'job' THEN 0 ELSE 1 END AS samples,
       CASE s.series
         WHEN 'queue' THEN jsonb_build_object(
           'ready', jsonb_build_object('sum', 1200, 'max', 40),
           'retry:30s', jsonb_build_object('sum', 90, 'max', 4),
           'retry:5m', jsonb_build_object('sum', 60, 'max', 2),
           'retry:1h', jsonb_build_object('sum', 30, 'max', 1),
           'dead_letters', jsonb_build_object('sum', 3000, 'max', 100))
         WHEN 'outbox' THEN jsonb_build_object(
           'backlog', jsonb_build_object('sum', 300, 'max', 12),
           'oldest_secs', jsonb_build_object('sum', 60, 'max', 3))
         ELSE '{}'::jsonb END AS gauges
FROM periods p CROSS JOIN series s;

INSERT INTO history_minutes SELECT series, name, at, units, failures, durations, samples, gauges
FROM seeded WHERE resolution = 'minute';
INSERT INTO history_hours SELECT series, name, at, units, failures, durations, samples, gauges
FROM seeded WHERE resolution = 'hour';
INSERT INTO history_days SELECT series, name, at, units, failures, durations, samples, gauges
FROM seeded WHERE resolution = 'day';

\echo 'written over the week:'
SELECT 'history_minutes' AS "table", count(*) AS rows FROM history_minutes
UNION ALL SELECT 'history_hours', count(*) FROM history_hours
UNION ALL SELECT 'history_days', count(*) FROM history_days;

-- The retention job's sweep (worker_store::history::sweep_batch, here in one statement).
DELETE FROM history_minutes WHERE at < now() - interval '2 days';
DELETE FROM history_hours WHERE at < now() - interval '30 days';
DELETE FROM history_days WHERE at < now() - interval '365 days';
-- What a steady installation holds: autovacuum reuses the swept rows' space.
VACUUM FULL ANALYZE history_minutes;
VACUUM FULL ANALYZE history_hours;
VACUUM FULL ANALYZE history_days;

\echo 'kept after the sweep:'
SELECT t AS "table", (xpath('/row/c/text()', query_to_xml(format('SELECT count(*) AS c FROM %I', t), false, true, '')))[1]::text::bigint AS rows,
       pg_size_pretty(pg_total_relation_size(t)) AS total, pg_total_relation_size(t) AS bytes,
       pg_size_pretty(pg_relation_size(t)) AS heap,
       pg_size_pretty(pg_total_relation_size(t) - pg_relation_size(t)) AS "indexes and toast"
FROM unnest(ARRAY['history_minutes', 'history_hours', 'history_days']) AS t;
SELECT pg_size_pretty(sum(pg_total_relation_size(t))) AS "all three"
FROM unnest(ARRAY['history_minutes', 'history_hours', 'history_days']) AS t;
