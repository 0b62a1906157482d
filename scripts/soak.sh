#!/usr/bin/env bash
# An hour of steady load on the release host, sampled every minute, judged at the end
# (docs/SCALING.md, "An hour of steady load"). Not run in CI: it takes the hour.
#
#   scripts/soak.sh [--minutes 60] [--rate 50] [--sample 60s] [--binary PATH] [--out DIR]
#                   [--settle MIN] [--rss-ref MIN] [--direct-every S] [--fail-every S] [--keep]
#
#   --minutes N      how long the load runs (default 60)
#   --rate R         pings a second, APPENDed into the host's Dovecot account (default 50)
#   --sample D       time between samples: 60s, 15s, 1m (default 60s)
#   --binary PATH    a worker-host binary to use instead of building the release one
#                    (`cargo build --release -p worker-host`, about 10 minutes from cold here)
#   --out DIR        where report.md, chart.svg, samples.json and host.log go
#                    (default target/soak/<UTC time>)
#   --settle MIN     the minute from which nothing may grow (default a sixth of the run: 10 of 60)
#   --rss-ref MIN    the minute whose RSS the rest is held to (default a twelfth: 5 of 60)
#   --direct-every S seconds between direct email.send commands (default 1)
#   --fail-every S   seconds between refused mails, each dead-lettered then replayed (default 30)
#   --keep           keep the run's database, vhost and mailboxes for a look afterwards
#
# Needs the local services (scripts/services.sh up), psql and gnuplot (apt-get install
# gnuplot-nox). The host gets a database and a vhost of its own, created here and dropped at
# the end, and runs config/worker-host.example.toml as shipped but for where the services are
# (from the environment), one IMAP account and the demo automation. Exit 0: every check
# passed; 1: a check failed, named on the last lines; 2: the run could not be made.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"

args="$*"
binary=""
out=""
pass=()
seconds() {
    case "$1" in
    *ms) awk -v ms="${1%ms}" 'BEGIN { print ms / 1000 }' ;;
    *s) echo "${1%s}" ;;
    *m) echo "$(( ${1%m} * 60 ))" ;;
    *) echo "$1" ;;
    esac
}
while [ $# -gt 0 ]; do
    case "$1" in
    --binary) binary="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --sample) pass+=(--sample "$(seconds "$2")"); shift 2 ;;
    --minutes | --rate | --settle | --rss-ref | --direct-every | --fail-every) pass+=("$1" "$2"); shift 2 ;;
    --keep) pass+=(--keep); shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "soak.sh: unknown argument $1 (see --help)" >&2; exit 64 ;;
    esac
done

command -v gnuplot >/dev/null || { echo "soak.sh: gnuplot is missing: apt-get install gnuplot-nox" >&2; exit 2; }
command -v psql >/dev/null || { echo "soak.sh: psql is missing" >&2; exit 2; }

if [ -z "$binary" ]; then
    (cd "$repo" && cargo build --release -p worker-host)
    binary="${CARGO_TARGET_DIR:-$repo/target}/release/worker-host"
fi
[ -x "$binary" ] || { echo "soak.sh: no binary at $binary" >&2; exit 2; }
binary="$(cd "$(dirname "$binary")" && pwd)/$(basename "$binary")"
out="${out:-$repo/target/soak/$(date -u +%Y%m%dT%H%M%SZ)}"

# services.sh answers for the checkout it lives in (its .services folder); addresses already in
# the environment (another checkout's services) are kept.
[ -n "${WH_TEST_DATABASE_URL:-}" ] || eval "$("$repo/scripts/services.sh" env)"

exec python3 "$here/soak.py" --binary "$binary" --out "$out" --command "scripts/soak.sh $args" "${pass[@]}"
