-- A circuit per dependency (issue 39): the SMTP relay, an IMAP account, a webhook host. A row
-- is an open circuit, seen by every replica (announced on the `job_pauses` channel, as a pause
-- is); closing it deletes the row. A circuit closed by hand is an audit entry
-- (`circuit-close`) whose target names the dependency and the operator's reason.
CREATE TABLE dependency_circuits (
    dependency    text PRIMARY KEY CHECK (length(dependency) BETWEEN 1 AND 300),
    opened_at     timestamptz NOT NULL DEFAULT now(),
    -- Why, in the dependency's own words (the relay's answer, the connection's error).
    reason        text NOT NULL,
    -- The replica whose failure opened it.
    opened_by     text NOT NULL,
    -- Probes failed since it opened: the cool-down doubles with each.
    failed_probes integer NOT NULL DEFAULT 0 CHECK (failed_probes >= 0),
    -- When the next probe may run; a replica that takes the probe moves it on by the probe's
    -- own bound, so that one replica probes at a time.
    probe_at      timestamptz NOT NULL,
    probed_by     text,
    last_probe_at timestamptz
);

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
        array(SELECT DISTINCT unnest(words || ARRAY['circuit-close']) ORDER BY 1));
END;
$$;
