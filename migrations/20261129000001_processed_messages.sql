-- The one shared processed-message guard (seed 000: IProcessedDomainEventGuard).
-- A row means: the effect of message `id` in `scope` has been applied and committed.
CREATE TABLE processed_messages (
    scope        text        NOT NULL,
    id           text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, id)
);

-- The retention sweep deletes by age.
CREATE INDEX processed_messages_processed_at ON processed_messages (processed_at);
