-- The audit log (issue 40): other teams' audit entries (`audit.entry` on the events exchange),
-- stored by the audit-log consumer, append-only and once each by the entry's own id.
-- Not the operators' audit trail, which is `dead_letter_actions`.
CREATE TABLE audit_log_entries (
    -- The entry's id (also its AMQP message_id): a redelivered or republished entry finds
    -- its row here and writes nothing, so no processed-message mark is needed.
    id          uuid        PRIMARY KEY,
    occurred_at timestamptz NOT NULL,
    actor       text        NOT NULL,
    action      text        NOT NULL,
    entity_type text        NOT NULL,
    entity_id   text        NOT NULL,
    data        jsonb       NOT NULL CHECK (jsonb_typeof(data) = 'object'),
    recorded_at timestamptz NOT NULL DEFAULT now()
);

-- `worker-host audit-log find` reads newest first, by actor, by entity, by time; retention
-- deletes by `occurred_at`.
CREATE INDEX audit_log_entries_occurred_at ON audit_log_entries (occurred_at, id);
CREATE INDEX audit_log_entries_actor ON audit_log_entries (actor, occurred_at);
CREATE INDEX audit_log_entries_entity ON audit_log_entries (entity_type, entity_id, occurred_at);

-- Append-only: an entry, once stored, is never rewritten (retention may still delete).
CREATE FUNCTION audit_log_entries_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log_entries is append-only: an entry is never updated';
END;
$$;
CREATE TRIGGER audit_log_entries_append_only
    BEFORE UPDATE ON audit_log_entries
    FOR EACH ROW EXECUTE FUNCTION audit_log_entries_append_only();
