-- Issue 28: a row written into the outbox wakes the drain on commit through a statement-level
-- trigger, so that a writer's INSERT (alone, or as a CTE of the statement that writes the
-- effect it announces) costs no `pg_notify` round trip of its own. PostgreSQL folds identical
-- notifications of one transaction into one, so a writer that still notifies itself (the
-- previous release, during a rolling upgrade) wakes the drain once, as before. A statement
-- that inserted no row (a CTE whose guard found a duplicate) wakes nothing.
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted) THEN
        PERFORM pg_notify('outbox', '');
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER outbox_notify AFTER INSERT ON outbox
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
