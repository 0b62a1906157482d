-- Issue 26: the console's history. Rollups by minute (kept two days), hour (thirty days) and
-- day (a year), one row per series (a job, a queue, the outbox), name and period. Each replica
-- adds its own job counts to the minute rows (an additive upsert); the replica that holds the
-- `history` lease writes the gauges and rolls minutes into hours and hours into days; the
-- retention job sweeps each table by `at`. New tables: nothing to expand or contract.
--
-- units: units of work finished; failures: {reason: count}; durations: counts per bucket of
-- worker_store::history::BOUNDS_MS (the last one past its end), mergeable across replicas;
-- samples and gauges: the gauge readings taken in the period, {name: {"sum": s, "max": m}}.
CREATE TABLE history_minutes (
    series text NOT NULL CHECK (series IN ('job', 'queue', 'outbox')),
    name text NOT NULL,
    at timestamptz NOT NULL,
    units bigint NOT NULL DEFAULT 0,
    failures jsonb NOT NULL DEFAULT '{}'::jsonb,
    durations bigint[] NOT NULL DEFAULT '{}',
    samples integer NOT NULL DEFAULT 0,
    gauges jsonb NOT NULL DEFAULT '{}'::jsonb,
    PRIMARY KEY (series, name, at)
);
CREATE INDEX history_minutes_at ON history_minutes (at);

CREATE TABLE history_hours (LIKE history_minutes INCLUDING ALL);
CREATE TABLE history_days (LIKE history_minutes INCLUDING ALL);
