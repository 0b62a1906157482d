-- no-transaction
-- Issue 27: a mail's story is searched by its Message-ID, on any account.
CREATE INDEX CONCURRENTLY IF NOT EXISTS inbound_emails_by_message_id
    ON inbound_emails (message_id) WHERE message_id IS NOT NULL;
