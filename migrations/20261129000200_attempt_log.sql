-- The attempt log (seed 003: a row per try): every failed try and every final outcome of a
-- consumer message or a timer tick; successful tries only when settings ask for them.
CREATE TABLE attempt_log (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job           text        NOT NULL,
    -- The message, for a consumer; the tick's sequence number, for a timer job.
    message_id    text,
    tick          bigint,
    -- The attempt across parks (x-attempt), 1 for a tick.
    attempt       integer     NOT NULL,
    -- The in-process try within the delivery or tick; 0 on a final outcome row that
    -- stands for the whole delivery.
    try_number    integer     NOT NULL,
    -- A try: succeeded, failed, cancelled. A final outcome: the runner's or the tick's
    -- (succeeded, parked, dead-lettered:gave-up, failed, skipped-busy...).
    outcome       text        NOT NULL,
    is_final      boolean     NOT NULL,
    failure_class text,
    error         text,
    duration_ms   double precision NOT NULL,
    at            timestamptz NOT NULL
);

-- Retention deletes by age; operators look a message up by job and id.
CREATE INDEX attempt_log_at ON attempt_log (at);
CREATE INDEX attempt_log_job_message ON attempt_log (job, message_id) WHERE message_id IS NOT NULL;
