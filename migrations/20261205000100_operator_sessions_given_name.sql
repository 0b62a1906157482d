-- A session of the bootstrap account (`admin.operator_token`) is shared by whoever holds the
-- token, so the name its operator gave at sign-in is kept with it and recorded beside the
-- account in every audit row of the session. Sessions of named accounts leave it empty.
ALTER TABLE operator_sessions ADD COLUMN given_name text;
