-- Issue 15, found on a database with a week of a busy installation's traffic
-- (docs/scale-audit.sh): the console's job page reads a job's latest attempt-log rows, and
-- through `attempt_log_at` alone that walked back over every other job's rows until it found
-- enough of this one's (300,000 rows for a timer that rarely fails, 25 ms).
CREATE INDEX attempt_log_job_at ON attempt_log (job, at DESC, id DESC);
