#!/usr/bin/env bash
# The demo, in one command: while `scripts/run.sh` runs, mail the demo account a "ping" from
# alice, wait for the worker host's reply to land in alice's mailbox, and print it.
#
#   scripts/demo-mail.sh            from alice@localhost
#   scripts/demo-mail.sh bob        from bob@localhost (password `secret`)
#   scripts/demo-mail.sh --fail 5   five pings from fail5xx-demo@localhost, whose replies the
#                                   SMTP server refuses (550): five dead letters, one group,
#                                   to see and replay in the console (http://127.0.0.1:9180/)
#   scripts/demo-mail.sh --fix      the SMTP server accepts fail5xx-demo@localhost from now on,
#                                   so a replay from the console delivers the replies
#   scripts/demo-mail.sh --unfix    it refuses that address again
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
imap="imap://127.0.0.1:10143/INBOX"
failing=fail5xx-demo

ping_from() {
    local sender=$1 subject=$2
    printf 'From: %s@localhost\r\nTo: demo@localhost\r\nSubject: %s\r\nMessage-ID: <%s.%s@demo>\r\n\r\nAre you there?\r\n' \
        "$sender" "$subject" "$(date +%s%N)" "$sender" |
        curl -sS --url smtp://127.0.0.1:2525 --mail-from "$sender@localhost" --mail-rcpt demo@localhost --upload-file -
}

# The folder of the SMTP server's runtime switches (scripts/services.sh env says where).
switch_dir() {
    eval "$(scripts/services.sh env)"
    echo "$WH_SERVICES_DIR/smtp-fail"
}

case "${1:-}" in
--fail)
    count=${2:-5}
    for i in $(seq 1 "$count"); do
        ping_from "$failing" "ping $(date +%H:%M:%S) #$i"
    done
    echo "sent $count pings from $failing@localhost; their replies will be refused with 550 and dead-lettered."
    echo "In a few seconds: http://127.0.0.1:9180/dead-letters (then scripts/demo-mail.sh --fix, and replay the group)."
    exit 0
    ;;
--fix)
    dir=$(switch_dir)
    echo "250 OK" >"$dir/$failing@localhost"
    echo "the SMTP server now accepts $failing@localhost ($dir/$failing@localhost); replay the group from the console."
    echo "The replies land in its mailbox: curl -s --user $failing:secret '$imap' --request 'SEARCH ALL'"
    exit 0
    ;;
--unfix)
    rm -f "$(switch_dir)/$failing@localhost"
    echo "the SMTP server refuses $failing@localhost again."
    exit 0
    ;;
esac

sender=${1:-alice}
subject="ping $(date +%H:%M:%S)"
ping_from "$sender" "$subject"
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
