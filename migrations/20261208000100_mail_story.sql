-- Issue 27: a mail's story, from the mailbox to the answer or to the reason there was none.
--
-- Why a `send_email` action was skipped, as a kind an operator can count and search by, beside
-- its reason in words (`skip_reason`): the loop guard (an automatic or list mail, or the host's
-- own), the recipient cap, or the reply limit. NULL on rows skipped before this release; their
-- reason's words still say which.
ALTER TABLE action_executions ADD COLUMN skip_kind text
    CHECK (skip_kind IN ('loop-guard', 'recipient-cap', 'reply-limit'));

-- Each message the outbox drain published, when the broker confirmed it, and its trace: a
-- mail's story reads each hop's publish time and trace id here, since the outbox's own rows
-- are not kept once published. Written in the drain's statement that settles the rows (no
-- statement more per message); swept by the retention job (`jobs.retention.publications`).
CREATE TABLE publications (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The outbox row's message id: an event's id, an action execution's, an outbound mail's.
    message_id    text        NOT NULL,
    routing_key   text        NOT NULL,
    published_at  timestamptz NOT NULL,
    -- The W3C trace id of its `traceparent` header, when it had one.
    trace_id      text
);
CREATE INDEX publications_message ON publications (message_id);
