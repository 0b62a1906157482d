-- no-transaction
-- Issue 27: the host counts the executions skipped in the last minutes, by kind, for its
-- alert on the reply limit (a handful of rows: skips are rare beside the rest).
CREATE INDEX CONCURRENTLY IF NOT EXISTS action_executions_skipped
    ON action_executions (finished_at) WHERE status = 'skipped';
