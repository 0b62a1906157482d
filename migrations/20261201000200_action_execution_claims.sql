-- Issue 10: no database connection is held across a webhook call. The action executor claims
-- an execution in a short transaction (`running`, with the claiming process and the time),
-- calls the webhook with no connection held, and records the outcome in a second short
-- transaction: `succeeded` (with the processed-message mark), `failed` (permanently), or back
-- to `pending` for another try. A parallel duplicate that finds a fresh claim backs off; a
-- claim older than the executor's stale limit (its webhook timeout, its record budget and a
-- margin) was left by a process that died, and may be taken over.
ALTER TABLE action_executions DROP CONSTRAINT action_executions_status_check;
ALTER TABLE action_executions ADD CONSTRAINT action_executions_status_check
    CHECK (status IN ('pending', 'running', 'succeeded', 'failed'));

ALTER TABLE action_executions
    -- The executor process (a uuid drawn at its start) that claimed the row last.
    ADD COLUMN claimed_by uuid,
    -- When it claimed it: a `running` row whose claim is older than the stale limit is stuck.
    ADD COLUMN claimed_at timestamptz;
