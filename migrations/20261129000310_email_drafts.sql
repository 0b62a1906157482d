-- Email drafts (seed 000): written by the platform, expired by the draft-expiry job once
-- `expires_at` has passed while they are still drafts.
CREATE TABLE email_drafts (
    id          uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    -- draft: being written; sent: handed over for sending; expired: its time ran out first.
    status      text        NOT NULL DEFAULT 'draft'
                CHECK (status IN ('draft', 'sent', 'expired')),
    recipients  text[]      NOT NULL DEFAULT '{}',
    subject     text        NOT NULL DEFAULT '',
    text_body   text,
    html_body   text,
    in_reply_to text,
    -- NULL: never expires.
    expires_at  timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    -- When the job marked it expired.
    expired_at  timestamptz,
    CHECK ((status = 'expired') = (expired_at IS NOT NULL))
);

-- The sweep looks for drafts past their expiry, oldest first; the index holds drafts only, so
-- it stays small however many sent and expired rows accumulate.
CREATE INDEX email_drafts_due ON email_drafts (expires_at) WHERE status = 'draft' AND expires_at IS NOT NULL;
