#!/usr/bin/env bash
# What a mail's story and its search cost on a week of a busy installation's data
# (docs/scale-seed.sql: 300,000 mails in and out, one every 2 s, from 50,000 senders), with
# each hop's publication (900,000 rows) added: a fresh database is migrated and seeded, then
# `worker-host mail find` and `mail show` are timed, each the median of 5 runs (the process's
# start and its connection included, about 15 ms of it; see the "bare" line). The database is
# dropped at the end.
#
#   docs/scale-mail-story.sh
#
# Needs the local services (scripts/services.sh up) and a built host (HOST_BIN, by default
# target/release/worker-host).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
db=wh_scale_story
server=postgres://worker_host:worker_host@127.0.0.1:5432
host_bin=${HOST_BIN:-target/release/worker-host}
export PGOPTIONS='-c client_min_messages=error'

psql "$server/postgres" -qX -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
# Without FORCE: an autovacuum worker of the seeded tables belongs to postgres, which this
# role may not terminate; the drop waits a moment for it instead.
drop() {
    for _ in 1 2 3 4 5; do
        psql "$server/postgres" -qX -c "DROP DATABASE IF EXISTS $db" 2>/dev/null && return
        sleep 2
    done
}
trap drop EXIT
export WORKER_HOST__DATABASE__NAME=$db
"$host_bin" migrate >/dev/null 2>&1
started=$(date +%s)
psql "$server/$db" -qX -v ON_ERROR_STOP=1 -f docs/scale-seed.sql
# The seed's mails and executions, joined as the loop joins them: each mail's event, the
# event's data naming the mail, and a publication per hop (the event, the action's command,
# the send command).
psql "$server/$db" -qX -v ON_ERROR_STOP=1 <<'SQL'
UPDATE inbound_emails i SET event_id = md5('e' || i.uid)::uuid;
UPDATE action_executions x SET event = jsonb_build_object('id', x.event_id,
    'data', jsonb_build_object('inbound_email_id', i.id))
FROM inbound_emails i WHERE i.event_id = x.event_id;
INSERT INTO publications (message_id, routing_key, published_at, trace_id)
SELECT m, k, now() - make_interval(secs => (300000 - g) * 2.0), md5(g::text)
FROM generate_series(1, 300000) g,
     LATERAL (VALUES (md5('e' || g)::uuid::text, 'email.received'),
                     (md5('x' || g)::uuid::text, 'automation.action'),
                     (md5('o' || g)::uuid::text, 'email.send')) AS h(m, k);
ANALYZE;
SQL
echo "seeded in $(($(date +%s) - started)) s"

median_ms() {
    local runs=()
    for _ in 1 2 3 4 5; do
        local t0 t1
        t0=$(date +%s%N)
        "$host_bin" "$@" >/dev/null
        t1=$(date +%s%N)
        runs+=($(( (t1 - t0) / 1000000 )))
    done
    printf '%s\n' "${runs[@]}" | sort -n | sed -n 3p
}

sender=c12345@example.com
mail=$(psql "$server/$db" -AtX -c "SELECT id FROM inbound_emails WHERE uid = 250000")
echo "| what | median of 5 (ms) |"
echo "|---|---|"
echo "| bare: \`worker-host mail show\` of a mail that is not there | $(median_ms mail show 00000000-0000-0000-0000-000000000000 2>/dev/null || true) |"
echo "| \`mail show ID\` (one mail's whole story) | $(median_ms mail show "$mail" --json) |"
echo "| \`mail find --from $sender\` (6 mails in the week, each with its end state) | $(median_ms mail find --from "$sender" --json) |"
echo "| \`mail find --message-id seed-250000@example.com\` | $(median_ms mail find --message-id seed-250000@example.com --json) |"
echo "| \`mail find --to $sender\` (the answers' recipient) | $(median_ms mail find --to "$sender" --json) |"
echo "| \`mail find --since 1h\` (the newest 50, each with its end state) | $(median_ms mail find --since 1h --json) |"
echo "| \`mail find --subject 'ping 2499' --since 7d\` (a subject's part, no index: a scan of the week) | $(median_ms mail find --subject 'ping 2499' --since 7d --json) |"
