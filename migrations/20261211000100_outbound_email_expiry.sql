-- Stale replies are not sent (issue 39): a reply older than its limit when its turn comes is
-- recorded `expired` and never sent.
--
-- expired     the email-send job took it past its limit: `expires_at` when the row has one,
--             else `created_at` + `jobs.email_send.max_age`. Not sent, not claimed again.
-- expires_at  the row's own limit, written by whatever queued it (an automation's `max_age`);
--             null: the job's setting applies (and with none, no limit).
ALTER TABLE outbound_emails ADD COLUMN expires_at timestamptz;

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
    WHERE c.conrelid = 'outbound_emails'::regclass
      AND c.conname = 'outbound_emails_status_check';
    EXECUTE 'ALTER TABLE outbound_emails DROP CONSTRAINT outbound_emails_status_check';
    EXECUTE format(
        'ALTER TABLE outbound_emails ADD CONSTRAINT outbound_emails_status_check '
        'CHECK (status = ANY (%L::text[]))',
        array(SELECT DISTINCT unnest(words || ARRAY['expired']) ORDER BY 1));
END;
$$;
