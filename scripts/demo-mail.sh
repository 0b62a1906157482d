#!/usr/bin/env bash
# The demo, in one command: while `scripts/run.sh` runs, mail the demo account a "ping" from
# alice, wait for the worker host's reply to land in alice's mailbox, and print it.
#
#   scripts/demo-mail.sh            from alice@localhost
#   scripts/demo-mail.sh bob        from bob@localhost (password `secret`)
set -euo pipefail
sender=${1:-alice}
subject="ping $(date +%H:%M:%S)"
imap="imap://127.0.0.1:10143/INBOX"

printf 'From: %s@localhost\r\nTo: demo@localhost\r\nSubject: %s\r\nMessage-ID: <%s.%s@demo>\r\n\r\nAre you there?\r\n' \
    "$sender" "$subject" "$(date +%s%N)" "$sender" |
    curl -sS --url smtp://127.0.0.1:2525 --mail-from "$sender@localhost" --mail-rcpt demo@localhost --upload-file -
echo "sent \"$subject\" from $sender@localhost to demo@localhost; waiting for the reply..."

for _ in $(seq 1 60); do
    found=$(curl -sS --user "$sender:secret" --url "$imap" --request "UID SEARCH SUBJECT \"Re: $subject\"" |
        tr -d '\r' | sed -n 's/^\* SEARCH *//p')
    if [ -n "$found" ]; then
        uid=${found%% *}
        echo "reply in $sender's INBOX (uid $uid):"
        curl -sS --user "$sender:secret" --url "$imap;UID=$uid;SECTION=HEADER.FIELDS%20(FROM%20SUBJECT%20IN-REPLY-TO%20DATE)" | tr -d '\r'
        curl -sS --user "$sender:secret" --url "$imap;UID=$uid;SECTION=TEXT" | tr -d '\r'
        exit 0
    fi
    sleep 0.5
done
echo "no reply within 30 s: is the host running (scripts/run.sh) and ready (curl 127.0.0.1:9180/readyz)?" >&2
exit 1
