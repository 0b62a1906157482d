-- Issue 12, item 3: no mail loops and no backscatter (RFC 3834). A `send_email` action does
-- not answer automatic, bulk or list mail, bounces, or the host's own mail, and no automation
-- mails one address more than the reply limit allows: such an execution ends `skipped`, with
-- the reason, and no email. It is finished like `succeeded` (the guard's mark is taken).
ALTER TABLE action_executions DROP CONSTRAINT action_executions_status_check;
ALTER TABLE action_executions ADD CONSTRAINT action_executions_status_check
    CHECK (status IN ('pending', 'running', 'succeeded', 'skipped', 'failed'));

ALTER TABLE action_executions ADD COLUMN skip_reason text;
