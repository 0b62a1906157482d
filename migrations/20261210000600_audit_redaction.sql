-- Personal data in the audit trail (issue 38): an edit's diff holds a customer's mail before
-- and after, and audit rows are never deleted. So a finished row may still be *redacted*: its
-- target (`filter`) and its note may lose text, replaced by a marker (`[redacted]` when the
-- retention job ages an edit's diff out after `jobs.retention.audit_diff`, `[erased]` when
-- `worker-host privacy erase` removes one person's data), and nothing else. Who acted, what
-- kind of action it was, when, its counts and the shape of its target stay as written. The
-- rule that no row is deleted stays.
--
-- Two new kinds: `privacy-erase` (an erasure, its address recorded only as a keyed hash) and
-- `privacy-export` (who read everything held about one address).

DO $$
DECLARE
    words text[];
BEGIN
    -- The check reads `IN ('a', 'b')` as first written, `= ANY ('{a,b}'::text[])` once
    -- rewritten: each quoted part is a word or an array of them.
    SELECT array_agg(DISTINCT word) INTO words
    FROM pg_constraint c
    CROSS JOIN LATERAL regexp_matches(pg_get_constraintdef(c.oid), '''([^'']+)''', 'g') AS m
    CROSS JOIN LATERAL unnest(CASE WHEN m[1] LIKE '{%' THEN m[1]::text[] ELSE ARRAY[m[1]] END)
        AS word
    WHERE c.conrelid = 'dead_letter_actions'::regclass
      AND c.conname = 'dead_letter_actions_action_check';
    EXECUTE 'ALTER TABLE dead_letter_actions DROP CONSTRAINT dead_letter_actions_action_check';
    EXECUTE format(
        'ALTER TABLE dead_letter_actions ADD CONSTRAINT dead_letter_actions_action_check '
        'CHECK (action = ANY (%L::text[]))',
        array(SELECT DISTINCT unnest(words || ARRAY['privacy-erase', 'privacy-export'])
              ORDER BY 1));
END;
$$;

-- Whether `new` is `old` with parts of its text replaced by `[redacted]` or `[erased]`: each
-- marker stands for at least one character of the old text, and the text around the markers
-- is the old text's.
CREATE FUNCTION audit_text_redacts(old text, new text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    pattern text;
BEGIN
    IF old IS NOT DISTINCT FROM new THEN
        RETURN true;
    END IF;
    IF old IS NULL OR new IS NULL OR new !~ '\[(redacted|erased)\]' THEN
        RETURN false;
    END IF;
    SELECT string_agg(regexp_replace(part, '([.^$*+?()\[\]{}|\\])', '\\\1', 'g'), '.+'
                      ORDER BY n)
      INTO pattern
      FROM unnest(regexp_split_to_array(new, '\[(redacted|erased)\]')) WITH ORDINALITY AS p(part, n);
    RETURN old ~ ('^' || pattern || '$');
END;
$$;

-- Whether the JSON `new` is `old` redacted: the same shape (the same keys, arrays of the same
-- length, the same numbers and booleans), where a string may be redacted as text is
-- (`audit_text_redacts`) and any value may be replaced whole by the string `[redacted]` or
-- `[erased]`.
CREATE FUNCTION audit_json_redacts(old jsonb, new jsonb) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    key text;
    i integer;
BEGIN
    IF old IS NOT DISTINCT FROM new THEN
        RETURN true;
    END IF;
    IF old IS NULL OR new IS NULL THEN
        RETURN false;
    END IF;
    IF jsonb_typeof(new) = 'string' AND (new #>> '{}') IN ('[redacted]', '[erased]') THEN
        RETURN true;
    END IF;
    IF jsonb_typeof(old) <> jsonb_typeof(new) THEN
        RETURN false;
    END IF;
    CASE jsonb_typeof(new)
    WHEN 'string' THEN
        RETURN audit_text_redacts(old #>> '{}', new #>> '{}');
    WHEN 'object' THEN
        IF (SELECT array_agg(k ORDER BY k) FROM jsonb_object_keys(old) AS k)
           IS DISTINCT FROM (SELECT array_agg(k ORDER BY k) FROM jsonb_object_keys(new) AS k) THEN
            RETURN false;
        END IF;
        FOR key IN SELECT jsonb_object_keys(old) LOOP
            IF NOT audit_json_redacts(old -> key, new -> key) THEN
                RETURN false;
            END IF;
        END LOOP;
        RETURN true;
    WHEN 'array' THEN
        IF jsonb_array_length(old) <> jsonb_array_length(new) THEN
            RETURN false;
        END IF;
        FOR i IN 0 .. jsonb_array_length(old) - 1 LOOP
            IF NOT audit_json_redacts(old -> i, new -> i) THEN
                RETURN false;
            END IF;
        END LOOP;
        RETURN true;
    ELSE
        RETURN false;
    END CASE;
END;
$$;

-- The audit rule of migration 20261204000100, with one more update a finished row accepts: a
-- redaction (every column as it was, but the target and the note redacted as above, and the
-- target's `redacted` key, an object saying when and why (`diff_aged_at`, `erased_at`), added
-- or replaced).
CREATE OR REPLACE FUNCTION dead_letter_actions_audit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.db_user := session_user;
        NEW.started_at := now();
        RETURN NEW;
    ELSIF TG_OP = 'UPDATE' THEN
        IF OLD.finished_at IS NOT NULL THEN
            IF (NEW.id, NEW.action, NEW.actor_user, NEW.actor_host, NEW.actor, NEW.dry_run,
                NEW.db_user, NEW.started_at, NEW.finished_at, NEW.rate, NEW.planned,
                NEW.matched, NEW.succeeded, NEW.failed, NEW.account, NEW.via)
               IS NOT DISTINCT FROM
               (OLD.id, OLD.action, OLD.actor_user, OLD.actor_host, OLD.actor, OLD.dry_run,
                OLD.db_user, OLD.started_at, OLD.finished_at, OLD.rate, OLD.planned,
                OLD.matched, OLD.succeeded, OLD.failed, OLD.account, OLD.via)
               AND jsonb_typeof(NEW.filter) = 'object'
               AND jsonb_typeof(NEW.filter -> 'redacted') = 'object'
               AND audit_json_redacts(OLD.filter - 'redacted', NEW.filter - 'redacted')
               AND audit_text_redacts(OLD.note, NEW.note) THEN
                RETURN NEW;
            END IF;
            RAISE EXCEPTION 'dead_letter_actions %: a finished audit row cannot be changed, only redacted', OLD.id
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

-- The retention job finds the edits whose diff is still there, oldest first.
CREATE INDEX dead_letter_actions_unredacted_edits
    ON dead_letter_actions (started_at)
    WHERE action = 'edit' AND (filter #> '{redacted,diff_aged_at}') IS NULL;
