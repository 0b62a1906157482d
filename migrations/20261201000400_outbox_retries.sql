-- How many times an operator made this row pending again after it had failed (`worker-host
-- outbox retry`). Each give-up after a retry is a failure of its own: the dead-letter archive
-- keys it `outbox:<id>:<retries>` (`outbox:<id>` before any retry), so a row that fails again
-- is archived again instead of being taken for the first failure.
ALTER TABLE outbox ADD COLUMN retries integer NOT NULL DEFAULT 0;
