-- Validates the wider status CHECK of dead_letters that 20261207000300 added NOT VALID: a scan
-- under SHARE UPDATE EXCLUSIVE, which lets writers on.
ALTER TABLE dead_letters VALIDATE CONSTRAINT dead_letters_status_check;
