-- The reconciler (crate job-reconciler): work that stays unfinished with no command left to
-- finish it is found, re-queued through the outbox a bounded number of times, then marked
-- `failed` with a dead letter saying why.

-- How many times the reconciler has re-queued the row's command. Past its limit the row is
-- given up on instead.
ALTER TABLE action_executions ADD COLUMN reconciler_requeues integer NOT NULL DEFAULT 0;
ALTER TABLE outbound_emails ADD COLUMN reconciler_requeues integer NOT NULL DEFAULT 0;

-- Stuck rows are looked up by how long ago they last changed, among the unfinished ones only
-- (whatever intermediate states other migrations add: the finished ones are named here).
CREATE INDEX action_executions_unfinished_by_update ON action_executions (updated_at)
    WHERE status NOT IN ('succeeded', 'failed');
CREATE INDEX outbound_emails_unfinished_by_update ON outbound_emails (updated_at)
    WHERE status NOT IN ('sent', 'failed');

-- "Has this row's command a live outbox row?": the pending outbox rows by message id.
CREATE INDEX outbox_pending_message_id ON outbox (message_id) WHERE status = 'pending';
