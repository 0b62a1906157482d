#!/usr/bin/env bash
# Local test services for the worker host, without Docker or systemd.
#
#   scripts/services.sh up        install what is missing (Debian/Ubuntu apt), start what is not
#                                 running, reuse what already answers; safe to run again (fast)
#   scripts/services.sh down      stop what this script started; leave reused services alone
#   scripts/services.sh status    one line per service; exit 0 only when all four answer (and,
#                                 with --rabbitmq-cluster or once up started it, the cluster)
#   scripts/services.sh env       print `export` lines for the tests (eval "$(scripts/services.sh env)")
#   scripts/services.sh selftest  send a mail through the SMTP sink, read it back over IMAP, check
#                                 the failure switches, PostgreSQL login and the RabbitMQ API
#
#   --rabbitmq-cluster            up: also start (or reuse) the three-node RabbitMQ cluster below;
#                                 down: stop only that cluster; status, env: the cluster too
#                                 (status shows it anyway once this script started it)
#
# Services (all on 127.0.0.1):
#   PostgreSQL  5432   role/database worker_host, password worker_host, CREATEDB, max_connections>=200
#                      (Debian cluster, e.g. `15 main`, started with pg_ctlcluster)
#   RabbitMQ    5672   guest/guest (an administrator, for the tests), management HTTP API on
#                      15672 (data under the services dir when started here); the host's own
#                      user worker_host/worker_host with configure, write and read on its own
#                      vhost worker_host only (created if missing, also on a reused broker)
#   RabbitMQ cluster   (with --rabbitmq-cluster) three more nodes, beside the one above, which
#                      keeps running: wh-cluster-1..3@localhost on AMQP 5673 5674 5675,
#                      management API 15673 15674 15675, Erlang distribution 25673 25674 25675,
#                      clustered with `rabbitmqctl join_cluster`, with the same users and vhost.
#                      Data, logs and the cluster's own Erlang cookie under
#                      <services dir>/rabbitmq-cluster. The nodes run as the user running this
#                      script, from RabbitMQ's unwrapped scripts (/usr/lib/rabbitmq/bin, or
#                      $WH_RABBITMQ_BIN), so they need no sudo. For the host:
#                      WORKER_HOST__BROKER__ADDRESSES='["127.0.0.1:5673","127.0.0.1:5674","127.0.0.1:5675"]'
#   Dovecot     10143  IMAP, plain logins: alice/secret bob/secret demo/demo ops/secret; any other
#                      user name logs in with password `secret`. Mail of user X is read from
#                      <services dir>/mail/X/Maildir.
#   SMTP sink   2525   scripts/smtp_sink.py under aiosmtpd: delivers every recipient's mail to
#                      <services dir>/mail/<local part>/Maildir (so it shows up in Dovecot).
#                      Chosen failures: local part fail4xx* -> 451 4.3.0, fail5xx* -> 550 5.1.1.
#                      Runtime switch: while the file <services dir>/smtp-fail/<address> exists
#                      (e.g. .services/smtp-fail/bob@localhost), its first line is the reply to
#                      RCPT for that address (e.g. `451 4.3.0 try later`); delete it to recover.
#
# Browser      Debian's chromium and chromium-driver are installed too (not started: each browser
#              test starts its own ChromeDriver on a free port, headless).
# nginx        Debian's nginx-light is installed too (not started: the test of the shipped
#              deploy/nginx file starts its own on a free port).
#
# Everything this script creates lives in ${WH_SERVICES_DIR:-<repo>/.services}, a folder that
# must belong to the user running the script and that no one else may write (checked, and the
# script refuses a symbolic link there: as root it would write wherever the link points) (PostgreSQL's
# Debian cluster stays where Debian keeps it). Run as root, or as a user who may use sudo.
# When root, mail files belong to the unprivileged system user `wh` (created if missing), which
# also runs the SMTP sink; as a normal user they belong to that user.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(dirname "$SCRIPT_DIR")
# True when every folder from / down to $1 lets other users through (o+x), so that the
# unprivileged mail user can reach a services dir below it.
traversable_by_others() {
    local path=$1
    while [ -n "$path" ] && [ "$path" != / ]; do
        case $(stat -c %A "$path" 2>/dev/null) in
            *x | *t) ;;
            *) return 1 ;;
        esac
        path=$(dirname "$path")
    done
}

if [ -n "${WH_SERVICES_DIR:-}" ]; then
    DIR=$WH_SERVICES_DIR
elif [ "$(id -u)" = 0 ] && ! traversable_by_others "$REPO_DIR"; then
    # A clone under a private home (/root/...): the mail user could not reach .services there.
    DIR=/var/tmp/worker-host-services
else
    DIR=$REPO_DIR/.services
fi
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

HOST=127.0.0.1
PG_PORT=5432
AMQP_PORT=5672
RABBIT_API_PORT=15672
IMAP_PORT=10143
SMTP_PORT=2525
DB_USER=worker_host
DB_PASS=worker_host
DB_NAME=worker_host
# The host's own RabbitMQ user and vhost (the default settings use them).
MQ_HOST_USER=worker_host
MQ_HOST_PASS=worker_host
MQ_HOST_VHOST=worker_host

say() { echo "services: $*"; }
warn() { echo "services: warning: $*" >&2; }
die() { echo "services: error: $*" >&2; exit 1; }

if [ "$(id -u)" = 0 ]; then IS_ROOT=1; else IS_ROOT=0; fi

as_root() {
    if [ "$IS_ROOT" = 1 ]; then
        "$@"
    else
        command -v sudo >/dev/null 2>&1 || die "not root and sudo is missing: cannot run $1"
        sudo "$@"
    fi
}

as_user() { # as_user USER CMD...
    local user=$1
    shift
    if [ "$IS_ROOT" = 1 ]; then
        runuser -u "$user" -- "$@"
    elif [ "$(id -un)" = "$user" ]; then
        "$@"
    else
        as_root -u "$user" -- "$@"
    fi
}

# private_dir DIR: create DIR, or check the one there, as a folder only the running user can
# write: not a symbolic link, owned by that user, no group or other write. The script (often
# root) writes its state, logs and configs below it; a folder another user could write, or a
# link planted in its place (e.g. in /var/tmp), would let them point those writes anywhere.
private_dir() {
    local d=$1
    [ -L "$d" ] && die "$d is a symbolic link; refusing to keep the services' state there"
    if [ ! -d "$d" ]; then
        (umask 022 && mkdir -p -- "$d") || die "cannot create $d"
    fi
    [ -L "$d" ] && die "$d is a symbolic link; refusing to keep the services' state there"
    [ "$(stat -c %u -- "$d")" = "$(id -u)" ] ||
        die "$d belongs to $(stat -c %U -- "$d"), not $(id -un); refusing to keep the services' state there"
    chmod go-w -- "$d"
}

# no_link PATH...: die when one of the paths is a symbolic link (before writing or chowning).
no_link() {
    local p
    for p in "$@"; do
        [ -L "$p" ] && die "$p is a symbolic link; refusing to write through it"
    done
    return 0
}

port_open() { timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/$1" 2>/dev/null; }

# GET a path of the RabbitMQ management API (on port $2, the shared node's by default) as
# guest/guest; success on HTTP 200.
rabbit_api_ok() {
    timeout 3 bash -c '
        exec 3<>"/dev/tcp/$0/$1" || exit 1
        printf "GET %s HTTP/1.0\r\nHost: %s\r\nAuthorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\n\r\n" "$2" "$0" >&3
        IFS= read -r line <&3 || exit 1
        case "$line" in "HTTP/1."?" 200"*) exit 0 ;; *) exit 1 ;; esac
    ' "$HOST" "${2:-$RABBIT_API_PORT}" "${1:-/api/overview}" 2>/dev/null
}

# wait_until NAME SECONDS LOG CHECK...: poll CHECK every 0.25 s, fail clearly on timeout.
wait_until() {
    local name=$1 secs=$2 logf=$3
    shift 3
    local deadline=$((SECONDS + secs))
    until "$@"; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "services: error: $name did not come up within ${secs}s; log: $logf" >&2
            if [ -r "$logf" ]; then tail -n 15 "$logf" | sed 's/^/    /' >&2; fi
            exit 1
        fi
        sleep 0.25
    done
}

marker() { echo "$DIR/state/$1.ours"; }
ours() { [ -e "$(marker "$1")" ]; }
origin() { if ours "$1"; then echo "started by us"; else echo "reused"; fi; }

# Python able to import aiosmtpd (Debian's python3-aiosmtpd lives in /usr/bin/python3, which
# may not be the first python3 on PATH, e.g. under pyenv).
smtp_python() {
    local p
    for p in /usr/bin/python3 "$(command -v python3 || true)"; do
        [ -n "$p" ] && [ -x "$p" ] && "$p" -c 'import aiosmtpd' 2>/dev/null && { echo "$p"; return 0; }
    done
    return 1
}

any_python() {
    if [ -x /usr/bin/python3 ]; then echo /usr/bin/python3; else command -v python3 || die "python3 is missing"; fi
}

pg_bin_present() { compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null; }

mail_user() { if [ "$IS_ROOT" = 1 ]; then echo wh; else id -un; fi; }

# ---------------------------------------------------------------------------------- install

install_missing() {
    local pkgs=()
    if ! port_open "$PG_PORT"; then
        { command -v pg_ctlcluster >/dev/null && pg_bin_present; } || pkgs+=(postgresql)
    fi
    command -v psql >/dev/null || [[ " ${pkgs[*]} " == *" postgresql "* ]] || pkgs+=(postgresql-client)
    if ! port_open "$AMQP_PORT"; then
        command -v rabbitmq-server >/dev/null || pkgs+=(rabbitmq-server)
    fi
    if ! port_open "$IMAP_PORT"; then
        { command -v dovecot >/dev/null && [ -x /usr/lib/dovecot/imap ]; } || pkgs+=(dovecot-imapd)
    fi
    if ! port_open "$SMTP_PORT"; then
        smtp_python >/dev/null || pkgs+=(python3-aiosmtpd)
    fi
    # The console's browser tests drive Debian's Chromium through its ChromeDriver.
    { command -v chromium && command -v chromedriver; } >/dev/null || pkgs+=(chromium chromium-driver)
    # The test of the shipped nginx file runs a real nginx of its own (not started here).
    [ -x /usr/sbin/nginx ] || pkgs+=(nginx-light)
    local extra
    for extra in "${EXTRAS[@]}"; do
        # shellcheck disable=SC2207 # package names have no spaces
        pkgs+=($("${extra}_packages"))
    done
    [ "${#pkgs[@]}" -gt 0 ] || return 0
    command -v apt-get >/dev/null || die "missing: ${pkgs[*]}; no apt-get here, install them by hand"
    local logf="$DIR/apt.log"
    say "installing ${pkgs[*]} with apt-get (log: $logf)"
    {
        as_root apt-get update &&
            as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -o DPkg::Lock::Timeout=300 \
                --no-install-recommends "${pkgs[@]}"
    } >>"$logf" 2>&1 || {
        tail -n 20 "$logf" | sed 's/^/    /' >&2
        die "apt-get install ${pkgs[*]} failed; log: $logf"
    }
}

# ---------------------------------------------------------------------------------- postgres

pg_cluster_5432() { # prints "VERSION NAME" of the Debian cluster on port 5432
    command -v pg_lsclusters >/dev/null || return 1
    pg_lsclusters -h 2>/dev/null | awk -v p="$PG_PORT" '$3 == p { print $1, $2; found = 1; exit } END { exit !found }'
}

pg_log() {
    local c
    if c=$(pg_cluster_5432); then echo "/var/log/postgresql/postgresql-${c% *}-${c#* }.log"; else echo "/var/log/postgresql/"; fi
}

pg_ready() {
    if command -v pg_isready >/dev/null; then
        pg_isready -q -h "$HOST" -p "$PG_PORT" -t 2
    else
        port_open "$PG_PORT"
    fi
}

pg_admin() { # psql as the postgres superuser over the local socket
    (cd / && as_user postgres psql -XqtA -v ON_ERROR_STOP=1 -p "$PG_PORT" "$@")
}

pg_start() {
    local c ver
    if ! c=$(pg_cluster_5432); then
        ver=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
        [ -n "$ver" ] || die "postgres: no PostgreSQL server installed"
        say "postgres: creating Debian cluster $ver main on port $PG_PORT"
        as_root pg_createcluster "$ver" main --port "$PG_PORT" >>"$DIR/postgres-create.log" 2>&1 ||
            die "postgres: pg_createcluster $ver main failed; log: $DIR/postgres-create.log"
        c="$ver main"
    fi
    # shellcheck disable=SC2086
    as_root pg_ctlcluster $c start 9>&- || die "postgres: pg_ctlcluster $c start failed; log: $(pg_log)"
    echo "$c" >"$(marker postgres)"
    wait_until postgres 60 "$(pg_log)" pg_ready
}

pg_setup() {
    local got
    # Fast path: the role logs in with its password, may create databases, enough connections.
    got=$(PGPASSWORD=$DB_PASS PGCONNECT_TIMEOUT=3 psql -XqtA -h "$HOST" -p "$PG_PORT" -U "$DB_USER" -d "$DB_NAME" \
        -c "select rolcreatedb, current_setting('max_connections')::int >= 200 from pg_roles where rolname = current_user" \
        2>/dev/null || true)
    [ "$got" = "t|t" ] && return 0

    pg_admin -c 'select 1' >/dev/null 2>&1 || die "postgres on $HOST:$PG_PORT is not administrable here (no local \
postgres superuser) and $DB_USER/$DB_PASS cannot log in with CREATEDB and max_connections>=200; fix it by hand"
    pg_admin >/dev/null <<SQL
DO \$\$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$DB_USER') THEN
    CREATE ROLE $DB_USER LOGIN CREATEDB PASSWORD '$DB_PASS';
  ELSE
    ALTER ROLE $DB_USER LOGIN CREATEDB PASSWORD '$DB_PASS';
  END IF;
END
\$\$;
SELECT 'CREATE DATABASE $DB_NAME OWNER $DB_USER' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$DB_NAME')
\gexec
ALTER DATABASE $DB_NAME OWNER TO $DB_USER;
SQL
    say "postgres: role and database $DB_USER ready"
    local maxc c
    maxc=$(pg_admin -c 'show max_connections')
    if [ "$maxc" -lt 200 ]; then
        pg_admin -c 'alter system set max_connections = 200' >/dev/null
        if c=$(pg_cluster_5432); then
            say "postgres: max_connections $maxc -> 200, restarting cluster $c"
            # shellcheck disable=SC2086
            as_root pg_ctlcluster $c restart 9>&- || die "postgres: restart failed; log: $(pg_log)"
            wait_until postgres 60 "$(pg_log)" pg_ready
        else
            warn "postgres: max_connections is $maxc; set to 200 with ALTER SYSTEM, restart the server to apply"
        fi
    fi
}

postgres_up() {
    if port_open "$PG_PORT"; then
        wait_until postgres 30 "$(pg_log)" pg_ready
        pg_setup
        say "postgres $(ours postgres && echo 'already running (started by us)' || echo reused) on $HOST:$PG_PORT"
    else
        pg_start
        pg_setup
        say "postgres started on $HOST:$PG_PORT (cluster $(cat "$(marker postgres)"), log: $(pg_log))"
    fi
}

postgres_down() {
    ours postgres || return 0
    local c
    c=$(cat "$(marker postgres)")
    if port_open "$PG_PORT"; then
        # shellcheck disable=SC2086
        as_root pg_ctlcluster $c stop -m fast || warn "postgres: pg_ctlcluster $c stop failed"
        say "postgres stopped (cluster $c)"
    fi
    rm -f "$(marker postgres)"
}

# ---------------------------------------------------------------------------------- rabbitmq

RMQ_DIR=$DIR/rabbitmq
RMQ_STARTUP_LOG=$DIR/rabbitmq-startup.log
RMQ_ENV=()

rabbit_prepare() {
    private_dir "$RMQ_DIR"
    no_link "$RMQ_DIR/mnesia" "$RMQ_DIR/log" "$RMQ_DIR/rabbitmq.conf" "$RMQ_DIR/enabled_plugins"
    mkdir -p "$RMQ_DIR/mnesia" "$RMQ_DIR/log"
    cat >"$RMQ_DIR/rabbitmq.conf" <<EOF
# generated by scripts/services.sh
listeners.tcp.default = $HOST:$AMQP_PORT
management.tcp.ip = $HOST
management.tcp.port = $RABBIT_API_PORT
EOF
    echo '[rabbitmq_management].' >"$RMQ_DIR/enabled_plugins"
    chmod 644 "$RMQ_DIR/rabbitmq.conf" "$RMQ_DIR/enabled_plugins"
    if as_user rabbitmq test -r "$RMQ_DIR/rabbitmq.conf" 2>/dev/null; then
        as_root chown -R rabbitmq:rabbitmq "$RMQ_DIR/mnesia" "$RMQ_DIR/log"
        RMQ_ENV=(
            RABBITMQ_MNESIA_BASE="$RMQ_DIR/mnesia"
            RABBITMQ_LOG_BASE="$RMQ_DIR/log"
            RABBITMQ_PID_FILE="$RMQ_DIR/mnesia/rabbitmq.pid"
            RABBITMQ_CONFIG_FILE="$RMQ_DIR/rabbitmq.conf"
            RABBITMQ_ENABLED_PLUGINS_FILE="$RMQ_DIR/enabled_plugins"
        )
    else
        # The rabbitmq user cannot reach the services dir (e.g. a private home): Debian defaults.
        say "rabbitmq: user rabbitmq cannot reach $RMQ_DIR; using Debian's default locations"
        RMQ_ENV=(RABBITMQ_PID_FILE=/var/lib/rabbitmq/wh-services.pid)
        as_root rabbitmq-plugins enable --offline rabbitmq_management >>"$RMQ_STARTUP_LOG" 2>&1 || true
    fi
}

rabbit_log() {
    local f
    if [ "${#RMQ_ENV[@]}" -gt 1 ]; then
        for f in "$RMQ_DIR"/log/rabbit@*.log; do
            [ -e "$f" ] && { echo "$f"; return; }
        done
        echo "$RMQ_DIR/log/ and $RMQ_STARTUP_LOG"
    else
        echo "/var/log/rabbitmq/"
    fi
}

rabbit_ready() { port_open "$AMQP_PORT" && rabbit_api_ok /api/overview; }

rabbit_start() {
    rabbit_prepare
    as_root env "${RMQ_ENV[@]}" rabbitmq-server -detached >>"$RMQ_STARTUP_LOG" 2>&1 9>&- ||
        die "rabbitmq: rabbitmq-server -detached failed; log: $RMQ_STARTUP_LOG"
    printf '%s\n' "${RMQ_ENV[@]}" >"$(marker rabbitmq)"
    wait_until rabbitmq 120 "$(rabbit_log)" rabbit_ready
}

rabbitmq_up() {
    if port_open "$AMQP_PORT"; then
        if ! rabbit_api_ok /api/overview; then
            # Give a booting node a moment, then enable the management plugin if it is off.
            local i
            for i in $(seq 1 20); do rabbit_api_ok /api/overview && break; sleep 0.25; done
            if ! rabbit_api_ok /api/overview; then
                command -v rabbitmq-plugins >/dev/null ||
                    die "rabbitmq on $HOST:$AMQP_PORT has no management API on $RABBIT_API_PORT and rabbitmq-plugins is missing"
                say "rabbitmq: enabling rabbitmq_management on the running node"
                as_root rabbitmq-plugins enable rabbitmq_management >>"$DIR/rabbitmq-plugins.log" 2>&1 9>&- ||
                    die "rabbitmq: enabling rabbitmq_management failed; log: $DIR/rabbitmq-plugins.log"
                wait_until "rabbitmq management API" 60 "$DIR/rabbitmq-plugins.log" rabbit_api_ok /api/overview
            fi
        fi
        say "rabbitmq $(ours rabbitmq && echo 'already running (started by us)' || echo reused) on $HOST:$AMQP_PORT (API $HOST:$RABBIT_API_PORT)"
    else
        rabbit_start
        say "rabbitmq started on $HOST:$AMQP_PORT (API $HOST:$RABBIT_API_PORT, log: $(rabbit_log))"
    fi
    rabbit_host_user
}

# The host's own user (MQ_HOST_USER) with configure, write and read on its own vhost only and
# no management tag, through the management API (on port $1, the shared node's by default) as
# guest; what exists is left as it is, so that a second run costs three GETs.
rabbit_host_user() {
    local made api_port=${1:-$RABBIT_API_PORT}
    made=$("$(any_python)" - "$HOST" "$api_port" "$MQ_HOST_USER" "$MQ_HOST_PASS" "$MQ_HOST_VHOST" <<'PY'
import base64, json, sys, urllib.error, urllib.parse, urllib.request
host, port, user, password, vhost = sys.argv[1:]
base = "http://%s:%s/api" % (host, port)
auth = "Basic " + base64.b64encode(b"guest:guest").decode()
q = lambda s: urllib.parse.quote(s, safe="")

def exists(path):
    req = urllib.request.Request(base + path, headers={"Authorization": auth})
    try:
        with urllib.request.urlopen(req, timeout=10):
            return True
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return False
        raise

def put(path, body):
    req = urllib.request.Request(base + path, method="PUT", data=json.dumps(body).encode(),
                                 headers={"Authorization": auth, "Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).close()

made = []
if not exists("/vhosts/" + q(vhost)):
    put("/vhosts/" + q(vhost), {})
    made.append("vhost " + vhost)
if not exists("/users/" + q(user)):
    put("/users/" + q(user), {"password": password, "tags": ""})
    made.append("user " + user)
perm = "/permissions/%s/%s" % (q(vhost), q(user))
if not exists(perm):
    put(perm, {"configure": ".*", "write": ".*", "read": ".*"})
    made.append("its rights on " + vhost)
print(", ".join(made))
PY
    ) || die "rabbitmq: could not create the host's user $MQ_HOST_USER on vhost $MQ_HOST_VHOST through the management API on $HOST:$api_port"
    [ -z "$made" ] || say "rabbitmq: created $made on $HOST:$api_port (the host's own user, rights on its vhost only)"
}

rabbitmq_down() {
    ours rabbitmq || return 0
    local envs=() pidf="" pid="" i
    mapfile -t envs <"$(marker rabbitmq)"
    for i in "${envs[@]}"; do
        case "$i" in RABBITMQ_PID_FILE=*) pidf=${i#RABBITMQ_PID_FILE=} ;; esac
    done
    [ -n "$pidf" ] && pid=$(as_root cat "$pidf" 2>/dev/null || true)
    if port_open "$AMQP_PORT" || { [ -n "$pid" ] && as_root kill -0 "$pid" 2>/dev/null; }; then
        as_root env "${envs[@]}" timeout 60 rabbitmqctl shutdown >/dev/null 2>&1 ||
            { [ -n "$pid" ] && as_root kill "$pid" 2>/dev/null; } || warn "rabbitmq: could not stop the node"
        if [ -n "$pid" ]; then
            for i in $(seq 1 80); do as_root kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        fi
        # epmd was started by the node; it refuses to die while other nodes are registered.
        epmd -kill >/dev/null 2>&1 || true
        say "rabbitmq stopped"
    fi
    rm -f "$(marker rabbitmq)"
}

# ---------------------------------------------------------------------------------- rabbitmq cluster

# Three nodes on loopback beside the shared one (see the header). Node i answers AMQP on
# AMQP_PORT+i, its management API on RABBIT_API_PORT+i and Erlang distribution on
# AMQP_PORT+20000+i (the shared node's 25672 plus i).
CLUSTER_DIR=$DIR/rabbitmq-cluster
CLUSTER_SIZE=3
CLUSTER_BIN=${WH_RABBITMQ_BIN:-/usr/lib/rabbitmq/bin}

cluster_node() { echo "wh-cluster-$1@localhost"; }
cluster_amqp_port() { echo $((AMQP_PORT + $1)); }
cluster_api_port() { echo $((RABBIT_API_PORT + $1)); }
cluster_dist_port() { echo $((AMQP_PORT + 20000 + $1)); }
cluster_node_dir() { echo "$CLUSTER_DIR/node$1"; }

# The addresses as a comma-separated list, and as the host's broker.addresses takes them.
cluster_addresses() {
    local i out=""
    for i in $(seq 1 "$CLUSTER_SIZE"); do out="$out${out:+,}$HOST:$(cluster_amqp_port "$i")"; done
    echo "$out"
}
cluster_addresses_toml() {
    local i out=""
    for i in $(seq 1 "$CLUSTER_SIZE"); do out="$out${out:+,}\"$HOST:$(cluster_amqp_port "$i")\""; done
    echo "[$out]"
}

# The environment of node I's server and of every rabbitmqctl call on it: HOME holds the
# cluster's own Erlang cookie, so that these calls reach its nodes and nothing else's (the
# shared node keeps its own cookie).
cluster_env() {
    local i=$1 d
    d=$(cluster_node_dir "$i")
    echo "HOME=$CLUSTER_DIR/home"
    echo "RABBITMQ_NODENAME=$(cluster_node "$i")"
    echo "RABBITMQ_DIST_PORT=$(cluster_dist_port "$i")"
    echo "RABBITMQ_MNESIA_BASE=$d/mnesia"
    echo "RABBITMQ_LOG_BASE=$d/log"
    echo "RABBITMQ_PID_FILE=$d/rabbitmq.pid"
    echo "RABBITMQ_CONFIG_FILE=$d/rabbitmq.conf"
    echo "RABBITMQ_ENABLED_PLUGINS_FILE=$d/enabled_plugins"
}

cluster_ctl() { # cluster_ctl I ARGS...: rabbitmqctl on node I, bounded
    local i=$1 envs=()
    shift
    mapfile -t envs < <(cluster_env "$i")
    env "${envs[@]}" timeout 120 "$CLUSTER_BIN/rabbitmqctl" -n "$(cluster_node "$i")" "$@" 9>&-
}

cluster_node_ready() { port_open "$(cluster_amqp_port "$1")" && rabbit_api_ok /api/overview "$(cluster_api_port "$1")"; }

cluster_log() { echo "$(cluster_node_dir "$1")/log/ and $(cluster_node_dir "$1")/startup.log"; }

# The nodes node 1's management API reports running, one name a line. Through the API, not
# rabbitmqctl, so that a cluster another checkout started (another cookie) is seen too.
cluster_running_members() {
    "$(any_python)" - "$HOST" "$(cluster_api_port 1)" <<'PY' 2>/dev/null
import base64, json, sys, urllib.request
host, port = sys.argv[1:]
req = urllib.request.Request("http://%s:%s/api/nodes" % (host, port),
                             headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
with urllib.request.urlopen(req, timeout=10) as r:
    for node in json.load(r):
        if node.get("running"):
            print(node["name"])
PY
}

cluster_is_member() { cluster_running_members | grep -qx "$(cluster_node "$1")"; }

cluster_clustered() {
    local i
    for i in $(seq 2 "$CLUSTER_SIZE"); do cluster_is_member "$i" || return 1; done
}

cluster_prepare() {
    private_dir "$CLUSTER_DIR"
    private_dir "$CLUSTER_DIR/home"
    no_link "$CLUSTER_DIR/home/.erlang.cookie"
    if [ ! -s "$CLUSTER_DIR/home/.erlang.cookie" ]; then
        # Erlang refuses a cookie others can read.
        (umask 077 && od -An -N20 -tx1 /dev/urandom | tr -d ' \n' >"$CLUSTER_DIR/home/.erlang.cookie")
        chmod 400 "$CLUSTER_DIR/home/.erlang.cookie"
    fi
    local i d
    for i in $(seq 1 "$CLUSTER_SIZE"); do
        d=$(cluster_node_dir "$i")
        private_dir "$d"
        no_link "$d/mnesia" "$d/log" "$d/rabbitmq.conf" "$d/enabled_plugins" "$d/startup.log"
        mkdir -p "$d/mnesia" "$d/log"
        cat >"$d/rabbitmq.conf" <<EOF
# generated by scripts/services.sh: node $i of the local three-node cluster
listeners.tcp.default = $HOST:$(cluster_amqp_port "$i")
management.tcp.ip = $HOST
management.tcp.port = $(cluster_api_port "$i")
EOF
        echo '[rabbitmq_management].' >"$d/enabled_plugins"
    done
}

cluster_start_node() {
    local i=$1 envs=() d port
    d=$(cluster_node_dir "$i")
    for port in "$(cluster_amqp_port "$i")" "$(cluster_api_port "$i")" "$(cluster_dist_port "$i")"; do
        port_open "$port" && die "rabbitmq cluster: port $port of node $i is taken by something else; free it or stop what holds it"
    done
    mapfile -t envs < <(cluster_env "$i")
    env "${envs[@]}" "$CLUSTER_BIN/rabbitmq-server" -detached >>"$d/startup.log" 2>&1 9>&- ||
        die "rabbitmq cluster: starting node $i failed; log: $(cluster_log "$i")"
}

# join_cluster for every node that is not a member of node 1's cluster yet (a node of its own
# after its first boot): stop its application, join, start it again.
cluster_join() {
    local i
    for i in $(seq 2 "$CLUSTER_SIZE"); do
        cluster_is_member "$i" && continue
        say "rabbitmq cluster: joining $(cluster_node "$i") to $(cluster_node 1)"
        {
            cluster_ctl "$i" stop_app &&
                cluster_ctl "$i" join_cluster "$(cluster_node 1)" &&
                cluster_ctl "$i" start_app
        } >>"$(cluster_node_dir "$i")/startup.log" 2>&1 ||
            die "rabbitmq cluster: node $i could not join $(cluster_node 1); log: $(cluster_node_dir "$i")/startup.log \
(a node clustered elsewhere before: scripts/services.sh down --rabbitmq-cluster, then remove $(cluster_node_dir "$i"))"
    done
}

rabbitmq_cluster_up() {
    local t0=$EPOCHREALTIME i started=()
    [ -x "$CLUSTER_BIN/rabbitmq-server" ] ||
        die "rabbitmq cluster: no $CLUSTER_BIN/rabbitmq-server (apt-get install rabbitmq-server, or set WH_RABBITMQ_BIN)"
    for i in $(seq 1 "$CLUSTER_SIZE"); do
        cluster_node_ready "$i" || started+=("$i")
    done
    if [ "${#started[@]}" -gt 0 ]; then
        cluster_prepare
        # All at once: a node that was clustered before waits at boot for the others.
        for i in "${started[@]}"; do cluster_start_node "$i"; done
        echo "$CLUSTER_DIR" >"$(marker rabbitmq-cluster)"
        for i in "${started[@]}"; do
            wait_until "rabbitmq cluster node $i" 180 "$(cluster_log "$i")" cluster_node_ready "$i"
        done
    fi
    if ! cluster_clustered; then
        ours rabbitmq-cluster ||
            die "rabbitmq cluster: nodes answer on $(cluster_addresses) but are not one cluster, and this script did not start them"
        cluster_join
        wait_until "rabbitmq cluster" 120 "$(cluster_log 1)" cluster_clustered
    fi
    rabbit_host_user "$(cluster_api_port 1)"
    if [ "${#started[@]}" -gt 0 ]; then
        say "rabbitmq cluster up in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')s (started nodes ${started[*]}; data in $CLUSTER_DIR)"
    else
        say "rabbitmq cluster $(ours rabbitmq-cluster && echo 'already running (started by us)' || echo reused)"
    fi
    for i in $(seq 1 "$CLUSTER_SIZE"); do
        say "rabbitmq cluster node $i: $(cluster_node "$i") on $HOST:$(cluster_amqp_port "$i") (API $HOST:$(cluster_api_port "$i"))"
    done
    say "rabbitmq cluster: for the host, WORKER_HOST__BROKER__ADDRESSES='$(cluster_addresses_toml)'"
}

rabbitmq_cluster_down() {
    ours rabbitmq-cluster || return 0
    local i pids=()
    for i in $(seq 1 "$CLUSTER_SIZE"); do
        if port_open "$(cluster_amqp_port "$i")" || cluster_ctl "$i" ping >/dev/null 2>&1; then
            # Given the pid file, `stop` returns once the node's OS process is gone.
            cluster_ctl "$i" stop "$(cluster_node_dir "$i")/rabbitmq.pid" >/dev/null 2>&1 &
            pids+=($!)
        fi
    done
    for i in "${pids[@]}"; do wait "$i" || warn "rabbitmq cluster: a node did not stop cleanly"; done
    rm -f "$(marker rabbitmq-cluster)"
    say "rabbitmq cluster stopped (data kept in $CLUSTER_DIR)"
}

cluster_status() {
    local i rc=0 origin_note
    if ours rabbitmq-cluster; then origin_note="started by us"; else origin_note="reused"; fi
    for i in $(seq 1 "$CLUSTER_SIZE"); do
        if cluster_node_ready "$i"; then
            printf 'services: %-9s up    %-34s %s\n' "rabbitmq-cluster-$i" \
                "$HOST:$(cluster_amqp_port "$i") (API $HOST:$(cluster_api_port "$i"))" "$origin_note"
        else
            printf 'services: %-9s down  %s\n' "rabbitmq-cluster-$i" "$HOST:$(cluster_amqp_port "$i")"
            rc=1
        fi
    done
    if [ "$rc" = 0 ]; then
        if cluster_clustered; then
            say "rabbitmq cluster: $CLUSTER_SIZE nodes clustered; addresses $(cluster_addresses)"
        else
            say "rabbitmq cluster: the nodes answer but are not one cluster"
            rc=1
        fi
    fi
    return $rc
}

# ---------------------------------------------------------------------------------- dovecot

DOVECOT_DIR=$DIR/dovecot
DOVECOT_CONF=$DOVECOT_DIR/dovecot.conf
DOVECOT_LOG=$DOVECOT_DIR/dovecot.log
CONFIG_CHANGED=0

ensure_mail_user() {
    [ "$IS_ROOT" = 1 ] || return 0
    if ! id -u wh >/dev/null 2>&1; then
        useradd -r -M -U -d /nonexistent -s /usr/sbin/nologin wh 2>/dev/null || useradd -r -M wh
        say "created system user wh for the mail files"
    fi
}

mail_dirs() {
    local mu
    mu=$(mail_user)
    ensure_mail_user
    private_dir "$DIR/smtp"
    no_link "$DIR/mail" "$DIR/smtp-fail" "$SMTP_PID" "$SMTP_LOG"
    mkdir -p "$DIR/mail" "$DIR/smtp-fail"
    # Anyone may set a failure switch (the tests do); sticky, so no one removes another's.
    chmod 1777 "$DIR/smtp-fail"
    if [ "$IS_ROOT" = 1 ] && [ "$(stat -c %U "$DIR/mail")" != "$mu" ]; then
        chown -R "$mu:$(id -gn "$mu")" "$DIR/mail"
    fi
}

# The mail user (wh when root) must reach the mail folder: a services dir under a private
# home (e.g. /root) cannot work; say so instead of failing obscurely later.
check_mail_access() {
    local mu
    mu=$(mail_user)
    [ "$mu" = "$(id -un)" ] && return 0
    as_user "$mu" test -w "$DIR/mail" 2>/dev/null && return 0
    die "user $mu cannot write $DIR/mail (a parent folder is private?); \
use a services dir it can reach, e.g. WH_SERVICES_DIR=/var/tmp/wh-services $0 up"
}

write_file_if_changed() { # write_file_if_changed PATH < content
    local tmp
    tmp=$(mktemp "$1.XXXXXX")
    cat >"$tmp"
    if cmp -s "$tmp" "$1"; then
        rm -f "$tmp"
    else
        chmod 644 "$tmp" && mv -f "$tmp" "$1"
        CONFIG_CHANGED=1
    fi
}

# The passdbs of the shared Dovecot and of the one behind Postfix and submission
# (scripts/services/postfix.sh): tokens, the known accounts, any other user with "secret".
dovecot_passdbs() {
    cat <<EOF
# Tokens (XOAUTH2, OAUTHBEARER): Dovecot's oauth2 passdb asks the test kit's token endpoint
# (scripts/services/oauth.sh) to introspect each one ($DOVECOT_DIR/oauth2.conf.ext).
passdb {
  driver = oauth2
  mechanisms = xoauth2 oauthbearer
  args = $DOVECOT_DIR/oauth2.conf.ext
}
# Known accounts with their own passwords.
# "none": lookups that sign no one in (doveadm's user lookups) go to these too.
passdb {
  driver = passwd-file
  mechanisms = plain login none
  args = scheme=PLAIN username_format=%u $DOVECOT_DIR/users
}
# Any other user name (any local part the SMTP sink delivered to) logs in with "secret";
# the known accounts are filtered out so that e.g. demo/secret still fails.
passdb {
  driver = static
  mechanisms = plain login none
  args = password=secret
  username_filter = !alice !bob !demo !ops *
}
EOF
}

# How the shared Dovecot and the one behind Postfix (scripts/services/postfix.sh) sign users
# in and where their mail is.
dovecot_logins() {
    local mu
    mu=$(mail_user)
    cat <<EOF
auth_mechanisms = plain login xoauth2 oauthbearer
# "Alice" and "alice@localhost" both log in as alice, whose mail is in mail/alice/Maildir.
auth_username_format = %Ln
first_valid_uid = 1
mail_location = maildir:$DIR/mail/%u/Maildir
# Tests try wrong passwords on purpose: answer failures at once (0.5 s tick) and switch off
# the per-IP auth penalty, which would otherwise slow later logins from 127.0.0.1 up to 15 s.
auth_failure_delay = 0
service anvil {
  unix_listener anvil-auth-penalty {
    mode = 0
  }
}
$(dovecot_passdbs)
userdb {
  driver = static
  args = uid=$mu gid=$(id -gn "$mu") home=$DIR/mail/%u
}
EOF
}

dovecot_config() {
    local mu
    mu=$(mail_user)
    private_dir "$DOVECOT_DIR"
    no_link "$DOVECOT_DIR/run" "$DOVECOT_DIR/state"
    mkdir -p "$DOVECOT_DIR/run" "$DOVECOT_DIR/state"
    write_file_if_changed "$DOVECOT_DIR/users" <<'EOF'
alice:{PLAIN}secret
bob:{PLAIN}secret
demo:{PLAIN}demo
ops:{PLAIN}secret
EOF
    # Dovecot 2.3 sends the introspection URL the token alone, never the login user: its own
    # username check is switched off (a fixed username_format), and pass_attrs matches the login
    # user against the mailboxes the endpoint says the token may open, refusing the login
    # (allow_nets set to a network no one connects from) when it is not one of them. So an
    # app-only token is checked against its app's mailboxes, as Exchange checks them.
    write_file_if_changed "$DOVECOT_DIR/oauth2.conf.ext" <<'EOF'
introspection_mode = post
introspection_url = http://127.0.0.1:10180/introspect
username_attribute = username
username_format = any
active_attribute = active
active_value = true
force_introspection = yes
pass_attrs = allow_nets=%{if;%Ln;~;%{oauth2:wh_mailboxes};0.0.0.0/0;192.0.2.255/32}
timeout_msecs = 10000
EOF
    write_file_if_changed "$DOVECOT_CONF" <<EOF
# generated by scripts/services.sh
protocols = imap
listen = $HOST
base_dir = $DOVECOT_DIR/run
state_dir = $DOVECOT_DIR/state
log_path = $DOVECOT_LOG
ssl = no
disable_plaintext_auth = no
$(dovecot_logins)
service auth {
  user = root
}
service imap-login {
  inet_listener imap {
    address = $HOST
    port = $IMAP_PORT
  }
  inet_listener imaps {
    port = 0
  }
}
service pop3-login {
  inet_listener pop3 {
    port = 0
  }
}
EOF
}

dovecot_up() {
    mail_dirs
    dovecot_config
    if port_open "$IMAP_PORT"; then
        if ours dovecot && [ "$CONFIG_CHANGED" = 1 ]; then
            as_root doveadm -c "$DOVECOT_CONF" reload 9>&- || die "dovecot: reload failed; log: $DOVECOT_LOG"
            say "dovecot: configuration changed, reloaded"
        fi
        say "dovecot $(ours dovecot && echo 'already running (started by us)' || echo reused) on $HOST:$IMAP_PORT"
        return 0
    fi
    check_mail_access
    as_root dovecot -c "$DOVECOT_CONF" >>"$DOVECOT_LOG" 2>&1 9>&- || {
        tail -n 15 "$DOVECOT_LOG" | sed 's/^/    /' >&2
        die "dovecot failed to start; log: $DOVECOT_LOG"
    }
    echo "$DOVECOT_DIR/run/master.pid" >"$(marker dovecot)"
    wait_until dovecot 20 "$DOVECOT_LOG" port_open "$IMAP_PORT"
    say "dovecot started on $HOST:$IMAP_PORT (log: $DOVECOT_LOG)"
}

dovecot_down() {
    ours dovecot || return 0
    local pid i
    # base_dir belongs to root (mode 0750 or so): read the pid file as root.
    pid=$(as_root cat "$DOVECOT_DIR/run/master.pid" 2>/dev/null || true)
    if [ -n "$pid" ] && as_root kill -0 "$pid" 2>/dev/null; then
        as_root kill "$pid" 2>/dev/null || true
        for i in $(seq 1 40); do as_root kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        as_root kill -0 "$pid" 2>/dev/null && die "dovecot (pid $pid) did not stop; log: $DOVECOT_LOG"
        say "dovecot stopped"
    elif port_open "$IMAP_PORT"; then
        as_root doveadm -c "$DOVECOT_CONF" stop 2>/dev/null || die "dovecot: cannot find its pid to stop it"
        say "dovecot stopped"
    fi
    rm -f "$(marker dovecot)"
}

# ---------------------------------------------------------------------------------- smtp sink

SMTP_PID=$DIR/smtp/smtp.pid
SMTP_LOG=$DIR/smtp/smtp.log

smtp_alive() { [ -s "$SMTP_PID" ] && kill -0 "$(cat "$SMTP_PID")" 2>/dev/null; }

smtp_ready() {
    smtp_alive || {
        echo "services: error: the SMTP sink exited; log: $SMTP_LOG" >&2
        tail -n 15 "$SMTP_LOG" | sed 's/^/    /' >&2
        exit 1
    }
    port_open "$SMTP_PORT"
}

smtp_up() {
    mail_dirs
    if port_open "$SMTP_PORT"; then
        say "smtp sink $(ours smtp && echo 'already running (started by us)' || echo reused) on $HOST:$SMTP_PORT"
        return 0
    fi
    local py mu drop=()
    check_mail_access
    py=$(smtp_python) || die "smtp: no python3 with aiosmtpd (apt-get install python3-aiosmtpd)"
    mu=$(mail_user)
    if [ "$IS_ROOT" = 1 ]; then drop=(setpriv --reuid="$mu" --regid="$(id -g "$mu")" --init-groups --); fi
    # The sink runs as the mail user, who may not reach the checkout (a clone under /root):
    # it runs from a copy of its module in the services dir.
    install -m 0644 "$SCRIPT_DIR/smtp_sink.py" "$DIR/smtp/smtp_sink.py"
    (
        cd "$DIR/smtp"
        exec setsid "${drop[@]}" env PYTHONPATH="$DIR/smtp" PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
            WH_SERVICES_DIR="$DIR" "$py" -m aiosmtpd -n -l "$HOST:$SMTP_PORT" -c smtp_sink.Handler
    ) >>"$SMTP_LOG" 2>&1 </dev/null 9>&- &
    echo $! >"$SMTP_PID"
    echo "$SMTP_PID" >"$(marker smtp)"
    wait_until "smtp sink" 20 "$SMTP_LOG" smtp_ready
    say "smtp sink started on $HOST:$SMTP_PORT as $mu (log: $SMTP_LOG)"
}

smtp_down() {
    ours smtp || return 0
    local pid i
    pid=$(cat "$SMTP_PID" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || as_root kill "$pid" 2>/dev/null || true
        for i in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        say "smtp sink stopped"
    fi
    rm -f "$(marker smtp)" "$SMTP_PID"
}

# ---------------------------------------------------------------------------------- commands

lock() {
    private_dir "$DIR"
    private_dir "$DIR/state"
    no_link "$DIR/state/lock"
    exec 9>"$DIR/state/lock"
    flock -w 600 9 || die "another services.sh holds $DIR/state/lock"
}

cmd_up() {
    local t0=$EPOCHREALTIME
    lock
    install_missing
    if ! port_open "$IMAP_PORT" || ! port_open "$SMTP_PORT"; then
        mail_dirs
        check_mail_access
    fi
    postgres_up
    rabbitmq_up
    dovecot_up
    smtp_up
    local extra
    for extra in "${EXTRAS[@]}"; do "${extra}_up"; done
    if [ "$WITH_CLUSTER" = 1 ]; then rabbitmq_cluster_up; fi
    say "all up in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')s; data in $DIR"
}

cmd_down() {
    lock
    rabbitmq_cluster_down
    if [ "$WITH_CLUSTER" = 1 ]; then
        say "down: the RabbitMQ cluster only; the other services keep running"
        return 0
    fi
    local i
    for ((i = ${#EXTRAS[@]} - 1; i >= 0; i--)); do "${EXTRAS[$i]}_down"; done
    smtp_down
    dovecot_down
    rabbitmq_down
    postgres_down
    say "down: stopped what this script had started"
}

status_line() { # NAME ADDR CHECK...
    local name=$1 addr=$2
    shift 2
    if "$@"; then
        printf 'services: %-9s up    %-34s %s\n' "$name" "$addr" "$(origin "$name")"
    else
        printf 'services: %-9s down  %s\n' "$name" "$addr"
        return 1
    fi
}

cmd_status() {
    local rc=0
    status_line postgres "$HOST:$PG_PORT" port_open "$PG_PORT" || rc=1
    status_line rabbitmq "$HOST:$AMQP_PORT (API $HOST:$RABBIT_API_PORT)" rabbit_ready || rc=1
    status_line dovecot "$HOST:$IMAP_PORT" port_open "$IMAP_PORT" || rc=1
    status_line smtp "$HOST:$SMTP_PORT" port_open "$SMTP_PORT" || rc=1
    local extra
    for extra in "${EXTRAS[@]}"; do "${extra}_status" || rc=1; done
    if [ "$WITH_CLUSTER" = 1 ] || ours rabbitmq-cluster; then
        cluster_status || rc=1
    fi
    return $rc
}

# The services dir of the SMTP sink that answers on the port, which may be another checkout's
# (a reused sink reads its failure switches and writes its mail there, not under $DIR).
running_sink_dir() {
    local pid dir
    for pid in $(pgrep -f "aiosmtpd .*-l $HOST:$SMTP_PORT" 2>/dev/null); do
        dir=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^WH_SERVICES_DIR=//p' | head -n 1)
        [ -n "$dir" ] && { echo "$dir"; return 0; }
    done
    return 1
}

cmd_env() {
    local dir
    dir=$(running_sink_dir) || dir=$DIR
    cat <<EOF
export WH_TEST_DATABASE_URL=postgres://$DB_USER:$DB_PASS@$HOST:$PG_PORT/$DB_NAME
export WH_TEST_AMQP_URL=amqp://guest:guest@$HOST:$AMQP_PORT/%2f
export WH_TEST_RABBIT_API=http://guest:guest@$HOST:$RABBIT_API_PORT
export WH_TEST_IMAP=$HOST:$IMAP_PORT
export WH_TEST_SMTP=$HOST:$SMTP_PORT
export WH_SERVICES_DIR=$dir
export WH_TEST_CHROMEDRIVER=$(command -v chromedriver || echo /usr/bin/chromedriver)
export WH_TEST_CHROMIUM=$(command -v chromium || echo /usr/bin/chromium)
EOF
    local extra
    for extra in "${EXTRAS[@]}"; do DIR=$dir "${extra}_env"; done
    if [ "$WITH_CLUSTER" = 1 ]; then
        echo "export WH_TEST_RABBIT_CLUSTER=$(cluster_addresses)"
    fi
}

cmd_selftest() {
    local py rc=0
    py=$(any_python)
    WH_SERVICES_DIR=$DIR WH_HOST=$HOST WH_SMTP_PORT=$SMTP_PORT WH_IMAP_PORT=$IMAP_PORT \
        WH_API_PORT=$RABBIT_API_PORT "$py" -u - <<'PY' || rc=$?
import base64, imaplib, json, os, smtplib, sys, time, uuid, urllib.request
from email.message import EmailMessage

host = os.environ["WH_HOST"]
smtp_port = int(os.environ["WH_SMTP_PORT"])
imap_port = int(os.environ["WH_IMAP_PORT"])
fail_dir = os.path.join(os.environ["WH_SERVICES_DIR"], "smtp-fail")
failures = []

def check(name, ok, detail=""):
    print("selftest: %-44s %s%s" % (name, "ok" if ok else "FAILED", "" if ok else "  " + detail))
    if not ok:
        failures.append(name)

def send(rcpt, subject):
    msg = EmailMessage()
    msg["From"] = "selftest@localhost"
    msg["To"] = rcpt
    msg["Subject"] = subject
    msg.set_content("selftest body " + subject)
    with smtplib.SMTP(host, smtp_port, timeout=10) as s:
        s.send_message(msg)

def rcpt_code(rcpt):
    with smtplib.SMTP(host, smtp_port, timeout=10) as s:
        s.ehlo()
        s.mail("selftest@localhost")
        code, text = s.rcpt(rcpt)
        s.rset()
        return code, text.decode()

def read_back(user, password, subject, wait=5.0):
    """Fetch the message with this subject over IMAP, then delete it (leave INBOXes clean)."""
    deadline = time.time() + wait
    while True:
        m = imaplib.IMAP4(host, imap_port, timeout=10)
        try:
            m.login(user, password)
            m.select("INBOX")
            typ, data = m.search(None, "SUBJECT", '"%s"' % subject)
            nums = data[0].split()
            if nums:
                typ, msg = m.fetch(nums[-1], "(RFC822)")
                for n in nums:
                    m.store(n, "+FLAGS", "\\Deleted")
                m.expunge()
                return msg[0][1]
        finally:
            try:
                m.logout()
            except Exception:
                pass
        if time.time() > deadline:
            return None
        time.sleep(0.2)

tag = uuid.uuid4().hex[:12]
try:
    subject = "wh-selftest-" + tag
    send("alice@localhost", subject)
    raw = read_back("alice", "secret", subject)
    check("mail to alice read back over IMAP", raw is not None and (b"selftest body " + subject.encode()) in raw,
          "subject %s not found in alice's INBOX" % subject)
    check("Delivered-To header", raw is not None and b"Delivered-To: alice@localhost" in raw)

    try:
        imaplib.IMAP4(host, imap_port, timeout=10).login("alice", "wrong")
        check("wrong password refused", False, "login alice/wrong succeeded")
    except imaplib.IMAP4.error:
        check("wrong password refused", True)

    code, text = rcpt_code("fail5xx-x@localhost")
    check("fail5xx recipient gets 550", code == 550, "%s %s" % (code, text))
    code, text = rcpt_code("fail4xx-x@localhost")
    check("fail4xx recipient gets 451", code == 451, "%s %s" % (code, text))

    switch = os.path.join(fail_dir, "bob@localhost")
    with open(switch, "w") as f:
        f.write("452 4.2.2 mailbox full (selftest)\n")
    try:
        code, text = rcpt_code("bob@localhost")
        check("smtp-fail switch makes bob fail", code == 452, "%s %s" % (code, text))
    finally:
        os.unlink(switch)
    code, text = rcpt_code("bob@localhost")
    check("bob accepted again after removing switch", code == 250, "%s %s" % (code, text))

    other = "wh-selftest"
    send(other + "@example.org", subject)
    raw = read_back(other, "secret", subject)
    check("any local part readable with password secret", raw is not None)
except Exception as e:
    check("mail round trip", False, repr(e))

try:
    req = urllib.request.Request("http://%s:%s/api/overview" % (host, os.environ["WH_API_PORT"]))
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=10) as r:
        ov = json.load(r)
    check("rabbitmq API (version %s)" % ov.get("rabbitmq_version"), True)
    q = "wh-selftest-%s" % tag
    url = "http://%s:%s/api/queues/%%2f/%s" % (host, os.environ["WH_API_PORT"], q)
    body = json.dumps({"durable": True, "arguments": {"x-queue-type": "quorum"}}).encode()
    req = urllib.request.Request(url, data=body, method="PUT", headers={"content-type": "application/json"})
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    urllib.request.urlopen(req, timeout=30).close()
    req = urllib.request.Request(url, method="DELETE")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    urllib.request.urlopen(req, timeout=30).close()
    check("rabbitmq quorum queue declare/delete", True)
except Exception as e:
    check("rabbitmq API", False, repr(e))

sys.exit(1 if failures else 0)
PY
    if command -v psql >/dev/null; then
        if PGPASSWORD=$DB_PASS PGCONNECT_TIMEOUT=5 psql -XqtA -h "$HOST" -p "$PG_PORT" -U "$DB_USER" -d "$DB_NAME" \
            -c "select rolcreatedb and current_setting('max_connections')::int >= 200 from pg_roles where rolname = current_user" 2>/dev/null |
            grep -qx t; then
            echo "selftest: postgres login, CREATEDB, max_connections>=200    ok"
        else
            echo "selftest: postgres login, CREATEDB, max_connections>=200    FAILED"
            rc=1
        fi
    fi
    if [ "$rc" = 0 ]; then echo "selftest: all ok"; else echo "selftest: FAILED" >&2; fi
    return "$rc"
}

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

# The mail servers besides Dovecot and the sink, each in a file of its own under
# scripts/services/ (sourced here in name order). A file NAME.sh adds NAME to EXTRAS and
# defines NAME_packages (prints the Debian packages it still needs, one word each),
# NAME_up, NAME_down (only what this script started), NAME_status (one status_line) and
# NAME_env (export lines). `up` starts them after the four above, `down` stops them first.
EXTRAS=()
for extra_file in "$SCRIPT_DIR"/services/*.sh; do
    [ -e "$extra_file" ] || continue
    # shellcheck source=/dev/null
    . "$extra_file"
done
unset extra_file

WITH_CLUSTER=0
COMMAND=${1:-}
[ "$#" -gt 0 ] && shift
for arg in "$@"; do
    case "$arg" in
    --rabbitmq-cluster) WITH_CLUSTER=1 ;;
    *)
        usage >&2
        exit 2
        ;;
    esac
done

case "$COMMAND" in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
env) cmd_env ;;
selftest) cmd_selftest ;;
-h | --help | help) usage ;;
*)
    usage >&2
    exit 2
    ;;
esac
