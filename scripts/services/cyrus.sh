# shellcheck shell=bash
# Sourced by scripts/services.sh: a second IMAP server that is not Dovecot.
#
#   Cyrus IMAP   127.0.0.1:10146  IMAP, STARTTLS offered (plain LOGIN allowed too)
#                127.0.0.1:10994  IMAP over TLS from the first byte
#                Both with the test CA's server certificate (scripts/services/00-tls.sh).
#                Logins: any user name with password `secret` (and alice/bob/ops `secret`,
#                demo `demo`): Cyrus asks saslauthd, which asks the shared Dovecot on 10143
#                (saslauthd -a rimap), so a wrong password is refused as Dovecot refuses it.
#                A user's INBOX (user.NAME) is created at the first login (autocreate_quota).
#                Admin: the user `cyrus` (password `secret`) may CREATE/DELETE user.NAME.
#                Folders: separator `.` under INBOX (INBOX.Sub; altnamespace off), IDLE
#                through Cyrus's idled.
#
# Debian's cyrus-imapd conflicts with dovecot-imapd, so it is not installed: its .debs
# (cyrus-common, cyrus-imapd, and sasl2-bin for saslauthd) are fetched with `apt-get download`
# and unpacked with `dpkg -x` under <services dir>/cyrus/root; only the shared libraries they
# depend on and that are missing are installed with apt-get. Cyrus's master, idled and
# saslauthd run from there as the mail user (wh when root), with their config, database,
# partition, sockets and logs under <services dir>/cyrus. Nothing goes to /etc or /var.

CYRUS_DIR=$DIR/cyrus
CYRUS_ROOT=$CYRUS_DIR/root
CYRUS_PORT=10146
CYRUS_TLS_PORT=10994
CYRUS_LOG=$CYRUS_DIR/log/master.log
SASLAUTHD_LOG=$CYRUS_DIR/log/saslauthd.log
CYRUS_DEBS=(cyrus-common cyrus-imapd sasl2-bin)
EXTRAS+=(cyrus)

# The libraries come from the unpacked packages' own Depends (installed in cyrus_up).
cyrus_packages() { :; }

# Where the packages' own libraries (libcyrus*.so.0) landed: usr/lib/<multiarch triplet>.
cyrus_libdir() {
    local lib
    lib=$(find "$CYRUS_ROOT/usr/lib" -name 'libcyrus_min.so.0' -print -quit)
    [ -n "$lib" ] || die "cyrus: no libcyrus_min.so.0 under $CYRUS_ROOT/usr/lib"
    dirname "$lib"
}

# Fetch and unpack the three packages once (root/.unpacked names their versions).
cyrus_unpack() {
    [ -s "$CYRUS_ROOT/.unpacked" ] && [ -x "$CYRUS_ROOT/usr/lib/cyrus/bin/master" ] && return 0
    local t0=$EPOCHREALTIME debs="$CYRUS_DIR/debs" logf="$CYRUS_DIR/install.log" d
    no_link "$debs" "$CYRUS_ROOT"
    rm -rf "$debs" "$CYRUS_ROOT"
    mkdir -p "$debs" "$CYRUS_ROOT"
    # apt-get download as root falls back to an unsandboxed fetch (the _apt user cannot
    # write here); that is expected.
    if ! (cd "$debs" && apt-get download "${CYRUS_DEBS[@]}") >>"$logf" 2>&1; then
        # No package lists yet (a fresh image): read them once, then try again.
        as_root apt-get update >>"$logf" 2>&1 || true
        (cd "$debs" && apt-get download "${CYRUS_DEBS[@]}") >>"$logf" 2>&1 || {
            tail -n 10 "$logf" | sed 's/^/    /' >&2
            die "cyrus: apt-get download ${CYRUS_DEBS[*]} failed; log: $logf"
        }
    fi
    for d in "$debs"/*.deb; do dpkg -x "$d" "$CYRUS_ROOT" || die "cyrus: dpkg -x $d failed"; done
    cyrus_libs
    (cd "$debs" && ls *.deb) >"$CYRUS_ROOT/.unpacked"
    say "cyrus: $(tr '\n' ' ' <"$CYRUS_ROOT/.unpacked")unpacked in $CYRUS_ROOT in \
$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')s (download, unpack, libraries)"
}

# Install the libraries the packages depend on and this machine lacks (the first choice of
# each alternative; only lib* packages: the rest is what the packages' scripts would use).
cyrus_libs() {
    local d missing=() p logf="$CYRUS_DIR/install.log"
    local -A want=()
    for d in "$CYRUS_DIR"/debs/*.deb; do
        for p in $(dpkg-deb -f "$d" Depends | tr ',' '\n' | sed 's/|.*//; s/(.*)//; s/:any//; s/[[:space:]]//g' | grep '^lib'); do
            want[$p]=1
        done
    done
    for p in "${!want[@]}"; do
        dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null | grep -qx installed || missing+=("$p")
    done
    [ "${#missing[@]}" -gt 0 ] || return 0
    say "cyrus: installing its libraries ${missing[*]} with apt-get (log: $logf)"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -o DPkg::Lock::Timeout=300 \
        --no-install-recommends --no-upgrade "${missing[@]}" >>"$logf" 2>&1 || {
        tail -n 20 "$logf" | sed 's/^/    /' >&2
        die "cyrus: apt-get install ${missing[*]} failed; log: $logf"
    }
}

cyrus_config() {
    local mu conf=$CYRUS_DIR/conf bin=$CYRUS_ROOT/usr/lib/cyrus/bin
    mu=$(mail_user)
    no_link "$conf" "$CYRUS_DIR/log" "$CYRUS_DIR/tls"
    mkdir -p "$conf" "$CYRUS_DIR/log" "$CYRUS_DIR/tls"
    # The mail user owns Cyrus's state; the configs stay the script's.
    local sub
    # lib/socket: each imapd's own socket for idled's news (idle.PID), always there.
    for sub in lib lib/socket spool run run/socket run/proc run/lock saslauthd; do
        no_link "$CYRUS_DIR/$sub"
        mkdir -p "$CYRUS_DIR/$sub"
    done
    # Cyrus reads its key as the mail user: a copy of its own (the shared one is root's).
    install -m 0644 "$MAIL_TLS_DIR/server.pem" "$CYRUS_DIR/tls/server.pem"
    install -m 0600 "$MAIL_TLS_DIR/server.key" "$CYRUS_DIR/tls/server.key"
    touch "$CYRUS_LOG" "$SASLAUTHD_LOG"
    if [ "$IS_ROOT" = 1 ]; then
        chown -R "$mu:$(id -gn "$mu")" "$CYRUS_DIR/lib" "$CYRUS_DIR/spool" "$CYRUS_DIR/run" \
            "$CYRUS_DIR/saslauthd" "$CYRUS_DIR/tls" "$CYRUS_LOG" "$SASLAUTHD_LOG"
    fi
    chmod 700 "$CYRUS_DIR/saslauthd"
    write_file_if_changed "$conf/imapd.conf" <<EOF
# generated by scripts/services/cyrus.sh
configdirectory: $CYRUS_DIR/lib
defaultpartition: default
partition-default: $CYRUS_DIR/spool
proc_path: $CYRUS_DIR/run/proc
mboxname_lockpath: $CYRUS_DIR/run/lock
lmtpsocket: $CYRUS_DIR/run/socket/lmtp
idlesocket: $CYRUS_DIR/run/socket/idle
notifysocket: $CYRUS_DIR/run/socket/notify
cyrus_user: $mu
syslog_prefix: cyrus-wh
servername: localhost
admins: cyrus
# Cyrus 3's compiled defaults are altnamespace and unixhierarchysep on (folders Sub, a/b):
# the netnews-style namespace instead, INBOX.Sub.
altnamespace: no
unixhierarchysep: no
autocreate_quota: 0
delete_mode: immediate
expunge_mode: immediate
allowplaintext: yes
sasl_pwcheck_method: saslauthd
sasl_saslauthd_path: $CYRUS_DIR/saslauthd/mux
sasl_mech_list: PLAIN LOGIN
tls_server_cert: $CYRUS_DIR/tls/server.pem
tls_server_key: $CYRUS_DIR/tls/server.key
tls_sessions_db_path: $CYRUS_DIR/lib/tls_sessions.db
EOF
    write_file_if_changed "$conf/cyrus.conf" <<EOF
# generated by scripts/services/cyrus.sh
START {
  recover   cmd="$bin/ctl_cyrusdb -C $conf/imapd.conf -r"
}
SERVICES {
  imap      cmd="$bin/imapd -C $conf/imapd.conf" listen="$HOST:$CYRUS_PORT" prefork=1 maxchild=50
  imaps     cmd="$bin/imapd -C $conf/imapd.conf -s" listen="$HOST:$CYRUS_TLS_PORT" prefork=1 maxchild=50
}
EVENTS {
  checkpoint cmd="$bin/ctl_cyrusdb -C $conf/imapd.conf -c" period=30
}
DAEMON {
  idled     cmd="$bin/idled -C $conf/imapd.conf"
}
EOF
}

cyrus_pid() { # cyrus_pid NAME: the pid of a process we started, when it still runs
    local pid
    pid=$(cat "$CYRUS_DIR/$1.pid" 2>/dev/null || true)
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

cyrus_ready() {
    cyrus_pid master >/dev/null || {
        echo "services: error: cyrus master exited; log: $CYRUS_LOG" >&2
        tail -n 15 "$CYRUS_LOG" | sed 's/^/    /' >&2
        exit 1
    }
    cyrus_answers
}

cyrus_up() {
    if cyrus_answers; then
        say "cyrus $(ours cyrus && echo 'already running (started by us)' || echo reused) on $HOST:$CYRUS_PORT, TLS $HOST:$CYRUS_TLS_PORT"
        return 0
    fi
    port_open "$IMAP_PORT" || die "cyrus: its logins go through Dovecot on $HOST:$IMAP_PORT, which does not answer"
    local t0=$EPOCHREALTIME mu drop=() lib
    private_dir "$CYRUS_DIR"
    mail_tls
    ensure_mail_user
    cyrus_unpack
    cyrus_config
    mu=$(mail_user)
    lib=$(cyrus_libdir)
    if [ "$IS_ROOT" = 1 ]; then drop=(setpriv --reuid="$mu" --regid="$(id -g "$mu")" --init-groups --); fi
    # A master that died leaves its pid file and sockets behind: start from clean ones.
    cyrus_down_processes
    rm -f "$CYRUS_DIR"/run/socket/* "$CYRUS_DIR"/saslauthd/mux*
    # saslauthd checks each password by logging in to the shared Dovecot (rimap).
    (
        exec setsid "${drop[@]}" "$CYRUS_ROOT/usr/sbin/saslauthd" -d -a rimap -O "$HOST/$IMAP_PORT" \
            -m "$CYRUS_DIR/saslauthd" -n 2
    ) >>"$SASLAUTHD_LOG" 2>&1 </dev/null 9>&- &
    echo $! >"$CYRUS_DIR/saslauthd.pid"
    # master -D stays in the foreground. Cyrus logs only to syslog, and there is none here:
    # the log holds what goes to stderr (errors before syslog is opened).
    (
        exec setsid "${drop[@]}" env LD_LIBRARY_PATH="$lib" "$CYRUS_ROOT/usr/lib/cyrus/bin/master" -D \
            -C "$CYRUS_DIR/conf/imapd.conf" -M "$CYRUS_DIR/conf/cyrus.conf" -p "$CYRUS_DIR/run/master.pid"
    ) >>"$CYRUS_LOG" 2>&1 </dev/null 9>&- &
    echo $! >"$CYRUS_DIR/master.pid"
    echo "$CYRUS_DIR/master.pid" >"$(marker cyrus)"
    wait_until cyrus 30 "$CYRUS_LOG" cyrus_ready
    say "cyrus started on $HOST:$CYRUS_PORT (STARTTLS) and $HOST:$CYRUS_TLS_PORT (TLS) as $mu in \
$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')s (log: $CYRUS_LOG)"
}

# Stop master (it stops its imapd and idled) and saslauthd, if we started them.
cyrus_down_processes() {
    local name pid i
    for name in master saslauthd; do
        pid=$(cyrus_pid "$name") || continue
        kill "$pid" 2>/dev/null || as_root kill "$pid" 2>/dev/null || true
        for i in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        kill -0 "$pid" 2>/dev/null && die "cyrus: $name (pid $pid) did not stop"
        rm -f "$CYRUS_DIR/$name.pid"
    done
    return 0
}

cyrus_down() {
    ours cyrus || return 0
    cyrus_down_processes
    rm -f "$(marker cyrus)"
    say "cyrus stopped"
}

cyrus_answers() { port_open "$CYRUS_PORT" && port_open "$CYRUS_TLS_PORT"; }

cyrus_status() { status_line cyrus "$HOST:$CYRUS_PORT (TLS $HOST:$CYRUS_TLS_PORT)" cyrus_answers; }

cyrus_env() {
    echo "export WH_TEST_CYRUS=$HOST:$CYRUS_PORT"
    echo "export WH_TEST_CYRUS_TLS=$HOST:$CYRUS_TLS_PORT"
}
