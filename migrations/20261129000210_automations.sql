-- Automations (issue 6): "when an event of this type arrives and its fields pass these
-- conditions, run these actions in order". Written by the platform; for demos and tests,
-- `worker-host automations import FILE` upserts them by name or id.
CREATE TABLE automations (
    id          uuid        PRIMARY KEY,
    name        text        NOT NULL UNIQUE CHECK (name <> ''),
    enabled     boolean     NOT NULL DEFAULT true,
    -- The domain event type it listens to (`email.received`): the events' routing key.
    event_type  text        NOT NULL CHECK (event_type <> ''),
    -- All must hold: [{"path": "subject", "op": "contains", "value": "ping"}, ...], where
    -- `op` is equals, contains or matches (a regular expression) and `path` a dotted path
    -- into the event's data. See job-automation-trigger.
    conditions  jsonb       NOT NULL DEFAULT '[]'::jsonb CHECK (jsonb_typeof(conditions) = 'array'),
    -- Ordered: [{"type": "send_email", ...}, {"type": "webhook", ...}]. An action's position
    -- in this list is part of its execution's derived id.
    actions     jsonb       NOT NULL DEFAULT '[]'::jsonb CHECK (jsonb_typeof(actions) = 'array'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- The trigger consumer loads the enabled automations of one event type per event.
CREATE INDEX automations_enabled_by_type ON automations (event_type) WHERE enabled;

-- One row per (event, automation) match. Deliberately not deduplicated (seed 000): a
-- redelivered event logs its match again; the action executions it leads to are deduplicated
-- by their derived ids instead.
CREATE TABLE automation_trigger_log (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    automation_id uuid        NOT NULL REFERENCES automations (id) ON DELETE CASCADE,
    event_id      uuid        NOT NULL,
    event_type    text        NOT NULL,
    matched_at    timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX automation_trigger_log_event ON automation_trigger_log (event_id);
CREATE INDEX automation_trigger_log_automation ON automation_trigger_log (automation_id, matched_at);
