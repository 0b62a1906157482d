-- The sending rate per SMTP account (issue 39): what each account sent in its rolling windows,
-- shared by every replica, so that ten replicas together stay within the provider's limits.
-- One row per account (`host:port/username`); every send takes its turn by locking the row
-- (an upsert), reading the windows, and writing them back with its send added, in one short
-- transaction: replicas taking turns at once are served one after the other.
CREATE TABLE smtp_send_rate (
    account           text PRIMARY KEY CHECK (length(account) BETWEEN 1 AND 600),
    -- The sends of the last minute, oldest first: a sliding log, exact to the send.
    minute_sends      timestamptz[] NOT NULL DEFAULT '{}',
    -- The last day's sends in 15-minute buckets, oldest first: each bucket's start, its
    -- messages and its recipients. A bucket counts until its end is a day old, so the day
    -- is never undercounted.
    bucket_starts     timestamptz[] NOT NULL DEFAULT '{}',
    bucket_messages   integer[] NOT NULL DEFAULT '{}',
    bucket_recipients integer[] NOT NULL DEFAULT '{}',
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CHECK (cardinality(bucket_starts) = cardinality(bucket_messages)
           AND cardinality(bucket_starts) = cardinality(bucket_recipients))
);
