-- The dead-letter archive (issue 7): every message that reached a `Q.dead` queue, and every
-- outbox row that ended `failed`, becomes a row here, searchable and replayable from the
-- command line (`worker-host dlq`). Rows are never deleted for lack of room; the retention
-- sweep deletes only rows already replayed or purged, once older than its window.

-- Every replay and purge, with who ran it from where, the filter, and how many it moved.
CREATE TABLE dead_letter_actions (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action      text        NOT NULL CHECK (action IN ('replay', 'purge')),
    -- The operating-system user and the host name of whoever ran the command.
    actor_user  text        NOT NULL,
    actor_host  text        NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    -- NULL while running, or when the command died on the way (its rows say how far it got).
    finished_at timestamptz,
    -- The filter as the operator gave it (queue, reason, fingerprint, since, limit, id).
    filter      jsonb       NOT NULL,
    -- Messages per second asked for, for a replay.
    rate        integer,
    matched     bigint      NOT NULL DEFAULT 0,
    succeeded   bigint      NOT NULL DEFAULT 0,
    failed      bigint      NOT NULL DEFAULT 0,
    -- The first failure of a replay, when there was one.
    note        text
);

CREATE TABLE dead_letters (
    id                bigserial   PRIMARY KEY,
    -- What makes archiving idempotent: `amqp:<sha256 of the dead queue, properties, headers
    -- (without the broker's delivery counters) and body>` for a message taken from a dead
    -- queue, so that the same message redelivered after a crash between the insert and the ack
    -- is archived once; `outbox:<outbox id>` for a failed outbox row.
    dedup_key         text        NOT NULL UNIQUE,
    -- Who dead-lettered it: `runner` (the x-dead-* headers of the consumer runner), `broker`
    -- (x-death: the queue's delivery limit), `outbox` (a failed outbox row) or `unknown`.
    source            text        NOT NULL CHECK (source IN ('runner', 'broker', 'outbox', 'unknown')),
    -- The queue it died in, where a replay sends it back; `outbox` for outbox rows.
    queue             text        NOT NULL,
    -- The dead queue it was taken from (NULL for outbox rows).
    dead_queue        text,
    -- Outbox rows are replayed to their own exchange and routing key.
    exchange          text,
    -- The original routing key (x-original-routing-key for a message parked on the way).
    routing_key       text,
    message_id        text,
    message_type      text,
    -- malformed | rejected | gave-up (runner), delivery_limit or another x-death reason
    -- (broker), outbox-failed, or unknown.
    reason            text        NOT NULL,
    -- transient | permanent | throttled | malformed, when the runner said.
    class             text,
    attempts          integer,
    last_error        text,
    -- The first 12 hex digits of the sha256 of `error_normalized`: one cause, one fingerprint.
    error_fingerprint text        NOT NULL,
    -- The error with ids, numbers, addresses and quoted strings replaced by placeholders.
    error_normalized  text        NOT NULL,
    died_at           timestamptz NOT NULL,
    archived_at       timestamptz NOT NULL DEFAULT now(),
    -- Every header as readable JSON (x-dead-*, x-death and all).
    headers           jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- The application headers a replay sends, AMQP types kept exactly (the FieldTable in serde
    -- form): the headers minus the dead-letter bookkeeping. NULL if they could not be kept.
    amqp_headers      jsonb,
    -- content_type, content_encoding, correlation_id, message_id, timestamp, type, app_id, ...
    properties        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    body              bytea       NOT NULL,
    outbox_id         bigint,
    status            text        NOT NULL DEFAULT 'dead'
                      CHECK (status IN ('dead', 'replayed', 'purged')),
    replayed_at       timestamptz,
    purged_at         timestamptz,
    -- The replay or purge that settled it.
    action_id         bigint      REFERENCES dead_letter_actions (id) ON DELETE SET NULL,
    CHECK (status <> 'replayed' OR replayed_at IS NOT NULL),
    CHECK (status <> 'purged' OR purged_at IS NOT NULL)
);

-- `dlq list` and `dlq show --queue`: the dead rows of a queue by age; depth and oldest age.
CREATE INDEX dead_letters_dead_by_queue ON dead_letters (queue, died_at) WHERE status = 'dead';
-- `dlq show --fingerprint` and the top fingerprints.
CREATE INDEX dead_letters_dead_by_fingerprint ON dead_letters (error_fingerprint, id)
    WHERE status = 'dead';
-- The inflow metric.
CREATE INDEX dead_letters_archived_at ON dead_letters (archived_at);
-- The retention sweep: settled rows by when they were settled.
CREATE INDEX dead_letters_settled ON dead_letters ((coalesce(replayed_at, purged_at)))
    WHERE status <> 'dead';
