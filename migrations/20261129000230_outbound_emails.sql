-- An email to send, queued by an automation's send_email action and sent by the outbound
-- email consumer (queue `email.send`, guard scope `email.send`). The id is derived from the
-- action execution that queued it (worker_messages::email_message_id).
CREATE TABLE outbound_emails (
    id                  uuid        PRIMARY KEY,
    -- The execution that queued it; NULL for mail queued by something else.
    action_execution_id uuid        UNIQUE REFERENCES action_executions (id) ON DELETE SET NULL,
    -- The Message-ID header, without angle brackets (`<id>@worker-host`).
    message_id          text        NOT NULL UNIQUE,
    -- The sender; NULL means the SMTP settings' default sender.
    from_address        text,
    to_addresses        text[]      NOT NULL CHECK (cardinality(to_addresses) > 0),
    cc_addresses        text[]      NOT NULL DEFAULT '{}',
    subject             text        NOT NULL,
    text_body           text,
    html_body           text,
    -- Threading, without angle brackets: the message replied to, and the References chain
    -- (oldest first, the replied-to message last).
    in_reply_to         text,
    reference_ids       text[]      NOT NULL DEFAULT '{}',
    -- queued: waiting for (or between) tries; sent: the server accepted it (smtp_response);
    -- failed: the server refused it for good (last_error holds its answer).
    status              text        NOT NULL DEFAULT 'queued'
                        CHECK (status IN ('queued', 'sent', 'failed')),
    attempts            integer     NOT NULL DEFAULT 0,
    last_error          text,
    smtp_response       text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    sent_at             timestamptz
);

CREATE INDEX outbound_emails_unsent ON outbound_emails (created_at) WHERE status <> 'sent';
