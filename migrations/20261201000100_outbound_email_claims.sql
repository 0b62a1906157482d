-- Outbound emails are claimed before the SMTP send and recorded after it, in two short
-- transactions, so that no database connection is held while the server is talking.
--
-- queued   waiting for (or between) tries;
-- sending  claimed by a try: claimed_by (the sending process) since claimed_at; a claim older
--          than the job's timeout plus a margin is stale and may be taken over;
-- sent     the server accepted it (smtp_response);
-- failed   the server refused it for good (last_error holds its answer), or it cannot be built;
-- unknown  the server may have accepted it: the send timed out or the connection broke after
--          the final "." of DATA. Sent again only by a later delivery of its command.
ALTER TABLE outbound_emails DROP CONSTRAINT outbound_emails_status_check;
ALTER TABLE outbound_emails
    ADD CONSTRAINT outbound_emails_status_check
        CHECK (status IN ('queued', 'sending', 'sent', 'failed', 'unknown')),
    ADD COLUMN claimed_by uuid,
    ADD COLUMN claimed_at timestamptz;
