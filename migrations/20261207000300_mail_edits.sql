-- Issue 26, part 3: edit and retry, where the failure is in the content. An operator edits a
-- failed outbound mail (its recipients, subject or body): a NEW row is sent in its place, naming
-- the one it supersedes, and the original keeps what it had, marked superseded. A malformed
-- dead letter's body is edited and published in its place. Either settles the dead letter as
-- `edited`, in the audit entry kind `edit` (with the diff).

-- The edited copy names its original; the original names the copy that superseded it, when
-- and who. `superseded_by` is set once (the edit's conditional update `WHERE superseded_by IS
-- NULL`): two operators editing one mail cannot both send. Nullable, no default: the previous
-- release neither reads nor writes them.
ALTER TABLE outbound_emails
    ADD COLUMN supersedes uuid,
    ADD COLUMN superseded_by uuid,
    ADD COLUMN superseded_at timestamptz,
    ADD COLUMN superseded_by_actor text;

-- Widening a CHECK (a new dead-letter status, a new audit kind) is an expand step in
-- substance: the previous release never writes the new words, and reads them as words it does
-- not know (`audit::shown`, the archive's status filter). PostgreSQL has no "widen": the old
-- CHECK must be dropped and a wider one added, which the lexical rule of
-- `migration_rules.rs` would count as a contract step (and a contract step would stop the
-- previous release from starting, for no reason here). So the swap is done in a block, each
-- wider list computed from the CHECK as it stands, so that another migration of this release
-- that widens the same CHECK keeps its words whichever runs first.
--
-- dead_letters.status: `edited` (the dead letter's message went out again, edited). An
-- edited row also gets `replayed_at` (when it was settled by sending again), so that the
-- retention sweep and its index (`coalesce(replayed_at, purged_at)`) take it like a replayed
-- one. The wider CHECK is added NOT VALID (no scan under the lock of a growing table): every
-- row already satisfies the narrower one; 20261207000310 validates it.
DO $$
DECLARE
    words text[];
BEGIN
    SELECT array_agg(DISTINCT m[1]) INTO words
    FROM pg_constraint c
    CROSS JOIN LATERAL regexp_matches(pg_get_constraintdef(c.oid), '''([^'']+)''', 'g') AS m
    WHERE c.conrelid = 'dead_letter_actions'::regclass
      AND c.conname = 'dead_letter_actions_action_check';
    EXECUTE 'ALTER TABLE dead_letter_actions DROP CONSTRAINT dead_letter_actions_action_check';
    EXECUTE format(
        'ALTER TABLE dead_letter_actions ADD CONSTRAINT dead_letter_actions_action_check '
        'CHECK (action = ANY (%L::text[]))',
        array(SELECT DISTINCT unnest(words || ARRAY['edit']) ORDER BY 1));

    SELECT array_agg(DISTINCT m[1]) INTO words
    FROM pg_constraint c
    CROSS JOIN LATERAL regexp_matches(pg_get_constraintdef(c.oid), '''([^'']+)''', 'g') AS m
    WHERE c.conrelid = 'dead_letters'::regclass
      AND c.conname = 'dead_letters_status_check';
    EXECUTE 'ALTER TABLE dead_letters DROP CONSTRAINT dead_letters_status_check';
    EXECUTE format(
        'ALTER TABLE dead_letters ADD CONSTRAINT dead_letters_status_check '
        'CHECK (status = ANY (%L::text[])) NOT VALID',
        array(SELECT DISTINCT unnest(words || ARRAY['edited']) ORDER BY 1));
END;
$$;
