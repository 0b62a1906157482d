-- no-transaction
-- Issue 27: a mail's story finds the dead letters of its commands by their message ids.
CREATE INDEX CONCURRENTLY IF NOT EXISTS dead_letters_message
    ON dead_letters (message_id) WHERE message_id IS NOT NULL;
