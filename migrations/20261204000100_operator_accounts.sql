-- Operators as a team (issue 23): named accounts with roles, their API tokens, and console
-- sessions that every replica shares; the audit trail names the account and how it acted.

-- One operator. `password_hash` is an argon2id PHC string (its parameters inside it), absent
-- for an account that signs in only through the auth proxy or only uses API tokens.
-- `origin` says how it was made: by an admin (`local`), by the auth proxy's first sign-in
-- (`proxy`), or from `admin.operator_token` (`bootstrap`, kept in step with the settings).
CREATE TABLE operator_accounts (
    name          text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._@+-]{0,79}$'),
    role          text        NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    password_hash text,
    origin        text        NOT NULL DEFAULT 'local'
                              CHECK (origin IN ('local', 'proxy', 'bootstrap')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    created_by    text        NOT NULL,
    disabled_at   timestamptz
);

-- An API token of an account, which acts with the account's role. Only its SHA-256 is kept:
-- a token is 32 random bytes, so no slow hash is needed to keep it from being guessed.
CREATE TABLE operator_tokens (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account      text        NOT NULL REFERENCES operator_accounts (name) ON DELETE CASCADE,
    label        text        NOT NULL,
    token_sha256 bytea       NOT NULL UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz
);

-- A console session. The cookie holds a random id; only its SHA-256 is kept, so that a reader
-- of this table cannot take a session over. `csrf` is the token the session's forms carry.
-- A session ends at `expires_at` (its absolute lifetime) or after the idle limit since
-- `last_seen_at`, whichever comes first; sign-out and disabling the account delete it.
CREATE TABLE operator_sessions (
    id_sha256    bytea       PRIMARY KEY,
    account      text        NOT NULL REFERENCES operator_accounts (name) ON DELETE CASCADE,
    csrf         text        NOT NULL,
    origin       text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);
CREATE INDEX operator_sessions_account ON operator_sessions (account);
CREATE INDEX operator_sessions_expires ON operator_sessions (expires_at);

-- The audit trail names the account that acted (absent for the command line, which acts
-- with the database's authority) and the way in: `cli`, `console` or `api`. Older rows have
-- neither. Managing accounts and forgetting a replica are recorded like every other action.
ALTER TABLE dead_letter_actions ADD COLUMN account text;
ALTER TABLE dead_letter_actions ADD COLUMN via text CHECK (via IN ('cli', 'console', 'api'));
ALTER TABLE dead_letter_actions DROP CONSTRAINT dead_letter_actions_action_check;
ALTER TABLE dead_letter_actions ADD CONSTRAINT dead_letter_actions_action_check
    CHECK (action IN ('replay', 'purge', 'outbox-retry', 'pause', 'resume', 'trigger',
                      'operator-add', 'operator-change', 'operator-disable', 'operator-remove',
                      'operator-token', 'replica-forget'));

-- The audit rule of migration 20261202000100, with `account` and `via` among what never
-- changes.
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
            NEW.db_user, NEW.started_at, NEW.filter, NEW.rate, NEW.planned, NEW.account, NEW.via)
           IS DISTINCT FROM
           (OLD.id, OLD.action, OLD.actor_user, OLD.actor_host, OLD.actor, OLD.dry_run,
            OLD.db_user, OLD.started_at, OLD.filter, OLD.rate, OLD.planned, OLD.account, OLD.via)
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
