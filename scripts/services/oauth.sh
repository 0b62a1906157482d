# shellcheck shell=bash
# Sourced by scripts/services.sh: the token endpoint standing in for Microsoft's and Google's
# (scripts/oauth_endpoint.py) on 127.0.0.1:10180, state in memory. The shared Dovecot's oauth2
# passdb (scripts/services.sh) and the one behind Postfix ask it to introspect each token.

OAUTH_PORT=10180
OAUTH_DIR=$DIR/oauth
OAUTH_PID=$OAUTH_DIR/oauth.pid
OAUTH_LOG=$OAUTH_DIR/oauth.log
EXTRAS+=(oauth)

oauth_python() {
    /usr/bin/python3 -c 'import cryptography' 2>/dev/null && echo /usr/bin/python3
}

oauth_packages() { oauth_python >/dev/null || echo python3-cryptography; }

oauth_alive() { [ -s "$OAUTH_PID" ] && kill -0 "$(cat "$OAUTH_PID")" 2>/dev/null; }

oauth_ready() {
    oauth_alive || {
        echo "services: error: the token endpoint exited; log: $OAUTH_LOG" >&2
        tail -n 15 "$OAUTH_LOG" | sed 's/^/    /' >&2
        exit 1
    }
    port_open "$OAUTH_PORT"
}

oauth_up() {
    private_dir "$OAUTH_DIR"
    if port_open "$OAUTH_PORT"; then
        say "token endpoint $(ours oauth && echo 'already running (started by us)' || echo reused) on $HOST:$OAUTH_PORT"
        return 0
    fi
    local py
    py=$(oauth_python) || die "oauth: /usr/bin/python3 cannot import cryptography (apt-get install python3-cryptography)"
    install -m 0644 "$SCRIPT_DIR/oauth_endpoint.py" "$OAUTH_DIR/oauth_endpoint.py"
    (
        cd "$OAUTH_DIR"
        exec setsid env PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 WH_OAUTH_HOST="$HOST" \
            WH_OAUTH_PORT="$OAUTH_PORT" "$py" "$OAUTH_DIR/oauth_endpoint.py"
    ) >>"$OAUTH_LOG" 2>&1 </dev/null 9>&- &
    echo $! >"$OAUTH_PID"
    echo "$OAUTH_PID" >"$(marker oauth)"
    wait_until "token endpoint" 20 "$OAUTH_LOG" oauth_ready
    say "token endpoint started on $HOST:$OAUTH_PORT (log: $OAUTH_LOG)"
}

oauth_down() {
    ours oauth || return 0
    local pid i
    pid=$(cat "$OAUTH_PID" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        for i in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        say "token endpoint stopped"
    fi
    rm -f "$(marker oauth)" "$OAUTH_PID"
}

oauth_status() { status_line oauth "$HOST:$OAUTH_PORT" port_open "$OAUTH_PORT"; }

oauth_env() { echo "export WH_TEST_OAUTH=http://$HOST:$OAUTH_PORT"; }
