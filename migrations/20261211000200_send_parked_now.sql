-- Send parked now (issue 39): an operator moves what waits in a queue's retry tiers back to
-- its work queue; each run, dry runs included, is an audit entry (`send-now`) whose target
-- names the queue and the operator's reason.
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
        array(SELECT DISTINCT unnest(words || ARRAY['send-now']) ORDER BY 1));
END;
$$;
