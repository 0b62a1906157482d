-- A week of a busy installation's traffic, for docs/scale-audit.sh: 300,000 mails in and out (one
-- every 2 s), 900,000 outbox rows and processed-message marks, 100,000 dead letters (80,000
-- waiting), 300,000 attempt-log rows. Run on an empty, migrated database.
\set n 300000
INSERT INTO automations (id, name, event_type, actions) VALUES
 ('00000000-0000-0000-0000-000000000001', 'seed-a', 'email.received', '[{"type":"send_email","to":["{{ from }}"],"subject":"Re","text":"x"}]'),
 ('00000000-0000-0000-0000-000000000002', 'seed-b', 'email.received', '[{"type":"send_email","to":["{{ from }}"],"subject":"Re","text":"x"}]');
INSERT INTO inbound_emails (id, account, mailbox, uidvalidity, uid, status, raw_size, message_id, from_address, subject, text_body, received_at, content_hash)
SELECT gen_random_uuid(), 'seed', 'INBOX', 1, g, 'stored', 1200, 'seed-' || g || '@example.com', 'c' || (g % 50000) || '@example.com', 'ping ' || g, 'body ' || g,
       now() - make_interval(secs => (:n - g) * 2.0), md5(g::text)
FROM generate_series(1, :n) g;
INSERT INTO action_executions (id, automation_id, event_id, action_index, action, event, status, created_at, updated_at, finished_at)
SELECT md5('x' || g)::uuid, CASE WHEN g % 2 = 0 THEN '00000000-0000-0000-0000-000000000001'::uuid ELSE '00000000-0000-0000-0000-000000000002'::uuid END,
       md5('e' || g)::uuid, 0, '{"type":"send_email"}', '{"id":"x","data":{}}', 'succeeded',
       now() - make_interval(secs => (:n - g) * 2.0), now() - make_interval(secs => (:n - g) * 2.0), now() - make_interval(secs => (:n - g) * 2.0)
FROM generate_series(1, :n) g;
INSERT INTO outbound_emails (id, action_execution_id, message_id, to_addresses, subject, text_body, status, created_at, updated_at, sent_at)
SELECT md5('o' || g)::uuid, md5('x' || g)::uuid, md5('o' || g) || '@worker-host', ARRAY['c' || (g % 50000) || '@example.com'], 'Re: ping', 'pong', 'sent',
       now() - make_interval(secs => (:n - g) * 2.0), now() - make_interval(secs => (:n - g) * 2.0), now() - make_interval(secs => (:n - g) * 2.0)
FROM generate_series(1, :n) g;
INSERT INTO outbound_email_recipients (outbound_email_id, automation_id, address, created_at)
SELECT e.id, x.automation_id, e.to_addresses[1], e.created_at FROM outbound_emails e JOIN action_executions x ON x.id = e.action_execution_id;
INSERT INTO outbox (message_id, exchange, routing_key, body, status, created_at, processed_at)
SELECT 'ob-' || g, 'events', 'email.received', convert_to(repeat('x', 800), 'UTF8'), 'processed',
       now() - make_interval(secs => (3 * :n - g) * 0.6), now() - make_interval(secs => (3 * :n - g) * 0.6)
FROM generate_series(1, 3 * :n) g;
INSERT INTO processed_messages (scope, id, processed_at)
SELECT (ARRAY['automation.trigger', 'automation.action', 'email.send'])[1 + g % 3], 'pm-' || g, now() - make_interval(secs => (3 * :n - g) * 0.6)
FROM generate_series(1, 3 * :n) g;
INSERT INTO dead_letters (dedup_key, source, queue, reason, error_fingerprint, error_normalized, died_at, body, message_id, last_error, status, replayed_at)
SELECT 'dl-' || g, 'runner', (ARRAY['email.send', 'automation.action', 'automation.trigger'])[1 + g % 3], (ARRAY['rejected', 'malformed', 'expired'])[1 + g % 3],
       'fp' || (g % 40), 'error kind ' || (g % 40), now() - make_interval(secs => (100000 - g) * 6.0), convert_to('{"n":' || g || '}', 'UTF8'), 'dlm-' || g, 'smtp-5xx: 550 no such user ' || g,
       CASE WHEN g % 5 = 0 THEN 'replayed' ELSE 'dead' END, CASE WHEN g % 5 = 0 THEN now() END
FROM generate_series(1, 100000) g;
INSERT INTO attempt_log (job, message_id, attempt, try_number, outcome, is_final, duration_ms, at)
SELECT (ARRAY['email-send', 'automation-action', 'automation-trigger'])[1 + g % 3], 'al-' || g, 1, 1, 'failed', g % 4 = 0, 3.5, now() - make_interval(secs => (:n - g) * 2.0)
FROM generate_series(1, :n) g;
INSERT INTO automation_trigger_log (automation_id, event_id, event_type, matched_at)
SELECT '00000000-0000-0000-0000-000000000001', md5('t' || g)::uuid, 'email.received', now() - make_interval(secs => (:n - g) * 2.0)
FROM generate_series(1, :n) g;
VACUUM ANALYZE;
