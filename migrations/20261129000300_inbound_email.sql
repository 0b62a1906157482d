-- Inbound email (seed 000): what the inbound email poller read from each IMAP account.

-- Where the poller is in each account's mailbox. A UID means something only under its
-- UIDVALIDITY: when the server reports another one, the poller starts the mailbox over
-- (last_uid 0) and skips mail whose Message-ID it stored under an earlier UIDVALIDITY.
CREATE TABLE imap_poll_state (
    account     text        NOT NULL,
    mailbox     text        NOT NULL,
    uidvalidity bigint      NOT NULL,
    -- The highest UID handled (stored, skipped or found a duplicate); 0 before the first.
    last_uid    bigint      NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account, mailbox)
);

-- One row per message the poller handled, stored or skipped.
CREATE TABLE inbound_emails (
    id              uuid        PRIMARY KEY,
    account         text        NOT NULL,
    mailbox         text        NOT NULL,
    uidvalidity     bigint      NOT NULL,
    uid             bigint      NOT NULL,
    -- stored: parsed (or not: see parse_error) and announced by an `email.received` event;
    -- skipped: recorded without its body and without an event (see skip_reason).
    status          text        NOT NULL CHECK (status IN ('stored', 'skipped')),
    skip_reason     text,
    -- The Message-ID header without angle brackets.
    message_id      text,
    from_address    text,
    from_name       text,
    to_addresses    text[]      NOT NULL DEFAULT '{}',
    cc_addresses    text[]      NOT NULL DEFAULT '{}',
    subject         text,
    -- The Date header.
    sent_at         timestamptz,
    in_reply_to     text,
    -- The References header's message ids, oldest first.
    reference_ids   text[]      NOT NULL DEFAULT '{}',
    -- Bodies, each bounded to the poller's max_body_chars; *_truncated says when cut.
    text_body       text,
    html_body       text,
    text_truncated  boolean     NOT NULL DEFAULT false,
    html_truncated  boolean     NOT NULL DEFAULT false,
    -- The RFC822.SIZE the server reported, in bytes.
    raw_size        bigint      NOT NULL,
    -- Why the mail did not parse; it is stored and announced all the same.
    parse_error     text,
    -- The id of the `email.received` event written to the outbox with this row.
    event_id        uuid,
    received_at     timestamptz NOT NULL DEFAULT now(),
    -- The poller's idempotency key.
    UNIQUE (account, mailbox, uidvalidity, uid),
    CHECK ((status = 'skipped') = (skip_reason IS NOT NULL))
);

-- After a UIDVALIDITY change, mail is deduplicated by Message-ID.
CREATE INDEX inbound_emails_message_id ON inbound_emails (account, mailbox, message_id)
    WHERE message_id IS NOT NULL;
-- Operators list recent mail.
CREATE INDEX inbound_emails_received_at ON inbound_emails (received_at);
