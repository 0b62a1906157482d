-- Issue 22: a replica that stops cleanly says so, so that the others can tell it from one that
-- went silent (killed, wedged, its machine gone): `worker_replicas{state="silent"}` and the
-- replica alert count only the second kind. Additive and nullable: no rewrite, and a release
-- before this one keeps writing its reports (it never sets the column).
ALTER TABLE replicas ADD COLUMN stopped_at timestamptz;
