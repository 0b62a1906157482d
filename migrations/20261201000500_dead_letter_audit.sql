-- The audit trail of `dlq replay` and `dlq purge` (issue 12): who ran it, also for a dry run,
-- and rows that the host's own role cannot rewrite or delete.

-- The name the operator gave (`--actor`, `WORKER_HOST_ACTOR`), beside the operating-system
-- user (`actor_user`, read from the process's user id, not from $USER).
ALTER TABLE dead_letter_actions ADD COLUMN actor text;
-- A dry run (`replay --dry-run`, `purge` without `--yes`): what would have been moved.
ALTER TABLE dead_letter_actions ADD COLUMN dry_run boolean NOT NULL DEFAULT false;
-- The database role the command connected as, set by the database itself (below).
ALTER TABLE dead_letter_actions ADD COLUMN db_user text NOT NULL DEFAULT session_user;

-- A row is written once and only its progress moves: while it is unfinished its counts may
-- grow, its note be set and it be finished; who, what, when and with which filter never
-- change; a finished row never changes; no row is deleted. The database sets `db_user` and
-- `started_at` itself, so that a client cannot backdate or misattribute a row.
CREATE FUNCTION dead_letter_actions_audit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.db_user := session_user;
        NEW.started_at := now();
        RETURN NEW;
    ELSIF TG_OP = 'UPDATE' THEN
        IF OLD.finished_at IS NOT NULL THEN
            RAISE EXCEPTION 'dead_letter_actions %: a finished audit row cannot be changed', OLD.id
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        IF (NEW.id, NEW.action, NEW.actor_user, NEW.actor_host, NEW.actor, NEW.dry_run,
            NEW.db_user, NEW.started_at, NEW.filter, NEW.rate)
           IS DISTINCT FROM
           (OLD.id, OLD.action, OLD.actor_user, OLD.actor_host, OLD.actor, OLD.dry_run,
            OLD.db_user, OLD.started_at, OLD.filter, OLD.rate)
           OR NEW.matched < OLD.matched OR NEW.succeeded < OLD.succeeded
           OR NEW.failed < OLD.failed THEN
            RAISE EXCEPTION 'dead_letter_actions %: an audit row only records progress (counts that grow, a note, its end)', OLD.id
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        RETURN NEW;
    ELSE
        RAISE EXCEPTION 'dead_letter_actions: audit rows cannot be deleted (%)', TG_OP
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END;
$$;

CREATE TRIGGER dead_letter_actions_audit
    BEFORE INSERT OR UPDATE OR DELETE ON dead_letter_actions
    FOR EACH ROW EXECUTE FUNCTION dead_letter_actions_audit();

CREATE TRIGGER dead_letter_actions_no_truncate
    BEFORE TRUNCATE ON dead_letter_actions
    FOR EACH STATEMENT EXECUTE FUNCTION dead_letter_actions_audit();

-- Belt and braces: no role gets DELETE or TRUNCATE through PUBLIC, and the migrating role
-- (the host's, usually the owner) gives them up. An owner can grant them back and drop the
-- triggers with DDL: an installation that needs the trail to hold against its host's role
-- itself runs migrations as a separate owner and grants the host SELECT, INSERT, UPDATE.
REVOKE DELETE, TRUNCATE ON dead_letter_actions FROM PUBLIC;
DO $$
BEGIN
    EXECUTE format('REVOKE DELETE, TRUNCATE ON dead_letter_actions FROM %I', current_user);
END;
$$;
