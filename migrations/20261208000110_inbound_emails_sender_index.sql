-- no-transaction
-- Issue 27: a mail's story is searched by sender, newest first.
CREATE INDEX CONCURRENTLY IF NOT EXISTS inbound_emails_sender
    ON inbound_emails (lower(from_address), received_at DESC);
