-- The transactional outbox (seed 002, part four): a job that changes the database and must
-- also publish a message writes the message here, in the same transaction; the outbox drain
-- job publishes it with confirms and marks the row by its id.
CREATE TABLE outbox (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id      text        NOT NULL,
    message_type    text,
    content_type    text,
    correlation_id  text,
    exchange        text        NOT NULL,
    routing_key     text        NOT NULL,
    -- Application headers (string, number or boolean values), the W3C trace context of the
    -- enqueuing span included.
    headers         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    body            bytea       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- pending: to publish once `next_attempt_at` has come; processed: published and
    -- confirmed; failed: gave up after the maximum attempts (see `last_error`), replayable.
    status          text        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'processed', 'failed')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    processed_at    timestamptz
);

-- The drain claims pending rows in id order; a partial index stays small however many
-- processed rows the retention window keeps.
CREATE INDEX outbox_pending ON outbox (id) INCLUDE (next_attempt_at) WHERE status = 'pending';
-- Operators list and replay failed rows.
CREATE INDEX outbox_failed ON outbox (id) WHERE status = 'failed';
-- The retention sweep deletes processed rows by age.
CREATE INDEX outbox_processed_at ON outbox (processed_at) WHERE status = 'processed';
