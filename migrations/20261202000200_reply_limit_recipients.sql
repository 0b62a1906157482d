-- Issue 15: the reply limit counted an automation's mails to one address by scanning every
-- mail the automation queued within the window (and each one's recipients), so each mail's
-- check grew with the automation's traffic: at 2,000 mails an hour it was 16 ms of
-- PostgreSQL's time per mail, the largest cost of the whole loop. One row per (mail,
-- recipient), written with the mail, makes the count a range of its own index.
CREATE TABLE outbound_email_recipients (
    outbound_email_id uuid        NOT NULL REFERENCES outbound_emails (id) ON DELETE CASCADE,
    automation_id     uuid        NOT NULL,
    -- Bare and lower-case: `Ann <Ann@Example.com>` is `ann@example.com`.
    address           text        NOT NULL,
    created_at        timestamptz NOT NULL,
    PRIMARY KEY (outbound_email_id, address)
);

CREATE INDEX outbound_email_recipients_count
    ON outbound_email_recipients (automation_id, address, created_at);

-- The mails queued before this table, so that the limit keeps counting them.
INSERT INTO outbound_email_recipients (outbound_email_id, automation_id, address, created_at)
SELECT DISTINCT e.id, x.automation_id,
       lower(btrim(coalesce(substring(r.a FROM '<([^<>]*)>[^<>]*$'), r.a))),
       e.created_at
FROM outbound_emails e
JOIN action_executions x ON x.id = e.action_execution_id
CROSS JOIN LATERAL unnest(e.to_addresses || e.cc_addresses) AS r(a)
ON CONFLICT DO NOTHING;
