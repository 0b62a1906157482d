-- Issue 12, item 4: one mail, one event, whatever the mailbox does.
--
-- A mail's identity is its Message-ID where it has one and the SHA-256 of its content where
-- it has not (content_hash is recorded for every mail the poller read, so both are there).
-- Before a new UID is stored, the poller looks the identity up among the mail it already
-- recorded from the same account and mailbox, under any UIDVALIDITY: a mail moved out of the
-- folder and back, a mailbox rebuilt, a new mail that reuses an older Message-ID. Such a UID
-- gets a row all the same, `skipped`, naming the row it duplicates, and no event.
ALTER TABLE inbound_emails
    -- Hex SHA-256 of the bytes read: the whole mail, or its header when the body was not
    -- fetched (over the size limit). NULL for rows written before this migration and for a
    -- mail given up on before it was read.
    ADD COLUMN content_hash text,
    -- For a `skipped` duplicate: the row of the mail it duplicates.
    ADD COLUMN duplicate_of uuid REFERENCES inbound_emails (id) ON DELETE SET NULL;

-- Mail without a Message-ID is deduplicated by its content.
CREATE INDEX inbound_emails_content_hash ON inbound_emails (account, mailbox, content_hash)
    WHERE content_hash IS NOT NULL;

-- The first poll of an account does not announce the mail that was there before the host
-- started watching it (unless the account says `backfill = true`). The poller writes the
-- account's row before its first connection, with `watching_since` the time its process
-- started and UIDVALIDITY 0 (a value no server gives: RFC 3501 makes it non-zero) meaning
-- "not selected yet"; a later process keeps the earliest time. At the first SELECT the poller
-- starts the mailbox after the last message that arrived (INTERNALDATE) before that time.
ALTER TABLE imap_poll_state ADD COLUMN watching_since timestamptz NOT NULL DEFAULT now();
