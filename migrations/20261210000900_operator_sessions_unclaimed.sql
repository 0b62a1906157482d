-- A session the auth proxy's header made for a request without a cookie is `unclaimed` until
-- its cookie comes back. Every such request used to make a row that lived until its lifetime
-- ended, so another site's <img> in a signed-in browser (whose SameSite=Strict cookie stays
-- home) filled the table; now a new one replaces the account's unclaimed ones. Rows made
-- before this migration, and sessions of the sign-in form, are claimed.
ALTER TABLE operator_sessions ADD COLUMN unclaimed boolean NOT NULL DEFAULT false;
