-- Bounces, tied back (issue 39): what each delivery status notification the poller read says
-- of each recipient, linked to the outbound mail it reports on.
--
-- outbound_bounces  one row per report and recipient (a report read twice adds nothing), written
--                   by the poller with the report's own `inbound_emails` row (kept `skipped`:
--                   a report is never announced, so never answered).
-- bounced           an outbound mail a report failed for good (`5.x.x`): accepted by the relay,
--                   then refused further on. A delay or a `4.x.x` leaves the mail as it was.
CREATE TABLE outbound_bounces (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The report, as the poller stored it.
    inbound_email_id  uuid        NOT NULL REFERENCES inbound_emails (id) ON DELETE CASCADE,
    -- The mail reported on; NULL when the host did not send it (or no longer has it).
    outbound_email_id uuid        REFERENCES outbound_emails (id) ON DELETE SET NULL,
    recipient         text        NOT NULL,
    -- As reported, in lower case: failed, delayed, delivered, relayed, expanded.
    action            text        NOT NULL,
    -- The RFC 3463 status code (5.1.1); NULL when the report gave none.
    status            text,
    -- permanent (5.x.x, or failed), transient (4.x.x, or delayed), other (delivered, ...).
    class             text        NOT NULL CHECK (class IN ('permanent', 'transient', 'other')),
    -- What the remote server said.
    diagnostic        text,
    -- When the report says it happened; NULL when it does not say.
    reported_at       timestamptz,
    recorded_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (inbound_email_id, recipient)
);

-- A mail's story reads its bounces.
CREATE INDEX outbound_bounces_outbound ON outbound_bounces (outbound_email_id)
    WHERE outbound_email_id IS NOT NULL;

DO $$
DECLARE
    words text[];
BEGIN
    -- As 20261211000100 did for `expired`: the check's words, whichever way it was written,
    -- and `bounced`.
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
        array(SELECT DISTINCT unnest(words || ARRAY['bounced']) ORDER BY 1));
END;
$$;
