-- The operator's console (issue 14): one audit trail for every operator action, a pause per
-- timer job that every replica obeys, and the replicas that report in.

-- Every action an operator takes, from the command line or the console, goes into the one
-- trail that `dlq replay` and `dlq purge` started: putting failed outbox rows back, pausing
-- and resuming a timer job, and running one now.
ALTER TABLE dead_letter_actions DROP CONSTRAINT dead_letter_actions_action_check;
ALTER TABLE dead_letter_actions ADD CONSTRAINT dead_letter_actions_action_check
    CHECK (action IN ('replay', 'purge', 'outbox-retry', 'pause', 'resume', 'trigger'));

-- What the operator was shown before confirming a bulk action (its dry run's count), so that
-- the trail says what they agreed to beside what was done. Written once, like the filter.
ALTER TABLE dead_letter_actions ADD COLUMN planned bigint;

-- The audit rule of migration 20261201000500, with `planned` among what never changes.
CREATE OR REPLACE FUNCTION dead_letter_actions_audit() RETURNS trigger
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
            NEW.db_user, NEW.started_at, NEW.filter, NEW.rate, NEW.planned)
           IS DISTINCT FROM
           (OLD.id, OLD.action, OLD.actor_user, OLD.actor_host, OLD.actor, OLD.dry_run,
            OLD.db_user, OLD.started_at, OLD.filter, OLD.rate, OLD.planned)
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

-- A paused timer job: its scheduled ticks are skipped (and counted) by every replica, which
-- reads this table before each tick, until an operator resumes it. "Run now" still runs it.
CREATE TABLE job_pauses (
    job       text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    -- The audit row of the pause: who paused it, from where, when.
    action_id bigint      NOT NULL REFERENCES dead_letter_actions (id)
);

-- Each host process that reports in, by its replica name: the console's list of replicas.
-- A row not seen for a week is removed by the next report of any replica.
CREATE TABLE replicas (
    name         text        PRIMARY KEY,
    installation text        NOT NULL,
    -- The machine it runs on and its process id, so that two processes that were given the
    -- same replica name show as such.
    host         text        NOT NULL,
    pid          integer     NOT NULL,
    version      text        NOT NULL,
    started_at   timestamptz NOT NULL,
    last_seen    timestamptz NOT NULL
);

-- The console's search: the dead letters that settled under one action (a dead letter's
-- history), and the ones a replay brought back dead (`x-replayed-from`).
CREATE INDEX dead_letters_action ON dead_letters (action_id) WHERE action_id IS NOT NULL;
CREATE INDEX dead_letters_replayed_from ON dead_letters (((headers ->> 'x-replayed-from')))
    WHERE headers ? 'x-replayed-from';
