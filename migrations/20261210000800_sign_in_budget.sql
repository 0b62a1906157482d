-- Each account's sign-in budget, shared by every replica, so that N replicas do not give
-- someone guessing a password N times the tries (the console's throttle, issue 38). A row
-- holds the time at which the account's budget is full again, as the generic cell rate
-- algorithm counts it: a try moves it one period on, and a try that would move it more than
-- a burst's worth past now is refused. The key is the name given at sign-in, lower-cased,
-- whether or not an account has it (a wrong name costs as much as a wrong password); rows
-- whose time has passed (a full budget) are swept as sign-ins come.
CREATE TABLE operator_sign_in_budget (
    account text        PRIMARY KEY,
    full_at timestamptz NOT NULL
);
