-- no-transaction
-- Issue 27: a mail's story is searched by the recipient of its answer, newest first.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbound_email_recipients_address
    ON outbound_email_recipients (address, created_at DESC);
