-- One action of one automation for one event. The id is derived (UUID v5) from the event id,
-- the automation id and the action's position (worker_messages::action_execution_id), so a
-- redelivered event finds the row already there and its command is dropped by the executor's
-- processed-message guard (scope `automation.action`).
CREATE TABLE action_executions (
    id            uuid        PRIMARY KEY,
    automation_id uuid        NOT NULL REFERENCES automations (id) ON DELETE CASCADE,
    event_id      uuid        NOT NULL,
    action_index  integer     NOT NULL CHECK (action_index >= 0),
    -- The action as it was when the event matched: a later edit of the automation does not
    -- change what a queued execution does.
    action        jsonb       NOT NULL,
    -- The event itself (id, type, occurred_at, data): what templates render from and what a
    -- webhook posts.
    event         jsonb       NOT NULL,
    -- pending: queued or being retried (see attempts and last_error); succeeded; failed:
    -- permanently (the command was dead-lettered with the same error).
    status        text        NOT NULL DEFAULT 'pending'
                  CHECK (status IN ('pending', 'succeeded', 'failed')),
    -- Tries made so far (every in-process try and every redelivery counts).
    attempts      integer     NOT NULL DEFAULT 0,
    last_error    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    UNIQUE (event_id, automation_id, action_index)
);

CREATE INDEX action_executions_automation ON action_executions (automation_id, created_at);
-- Operators list what is still pending or has failed.
CREATE INDEX action_executions_unfinished ON action_executions (created_at) WHERE status <> 'succeeded';
