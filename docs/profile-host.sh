#!/usr/bin/env bash
# The host's CPU profile under steady load: a short run of scripts/soak.sh (the release host,
# shipped defaults, pings through the whole loop) with `perf record` attached to the host for
# a while in the middle, then the top of the profile by object and by function.
#
#   docs/profile-host.sh [--binary PATH] [--seconds 60] [--rate 50] [--out DIR]
#
# Needs what scripts/soak.sh needs, and perf (apt-get install linux-perf). The profile is flat
# (the release build keeps its symbols but not frame pointers); perf.data stays in DIR for
# `perf report -i DIR/perf.data`.
set -euo pipefail

binary=""
seconds=60
rate=50
out="target/profile/$(date -u +%Y%m%dT%H%M%SZ)"
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary="$2"; shift 2 ;;
        --seconds) seconds="$2"; shift 2 ;;
        --rate) rate="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "profile-host: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
command -v perf >/dev/null || { echo "profile-host: perf is missing: apt-get install linux-perf" >&2; exit 2; }
cd "$(dirname "$0")/.."
mkdir -p "$out"
out="$(cd "$out" && pwd)"

# Long enough for the load to settle (20 s), the profile, and a margin.
minutes=$(python3 -c "print(round(($seconds + 50) / 60, 2))")
soak_args=(--minutes "$minutes" --rate "$rate" --sample 30s --out "$out/soak")
[ -n "$binary" ] && soak_args+=(--binary "$binary")
scripts/soak.sh "${soak_args[@]}" > "$out/soak.out" 2>&1 &
soak=$!

pid=""
for _ in $(seq 1 1200); do
    pid=$(sed -n 's/.*host pid \([0-9]*\),.*/\1/p' "$out/soak.out" | head -1)
    [ -n "$pid" ] && grep -q "load on" "$out/soak.out" && break
    kill -0 "$soak" 2>/dev/null || { cat "$out/soak.out" >&2; exit 2; }
    sleep 1
done
[ -n "$pid" ] || { echo "profile-host: the host never started (see $out/soak.out)" >&2; exit 2; }
sleep 20
perf record -F 499 -p "$pid" -o "$out/perf.data" -- sleep "$seconds" 2> "$out/perf-record.log"
wait "$soak" || true

{
    echo "# The host's profile: $seconds s at $rate pings/s (pid $pid)"
    echo
    echo "## By object"
    perf report -i "$out/perf.data" --no-children --sort dso --stdio 2>/dev/null | grep '%' | sed -n '1,8p'
    echo
    echo "## By function (the top 40)"
    perf report -i "$out/perf.data" --no-children --sort dso,symbol --stdio 2>/dev/null | grep '%' | sed -n '1,40p'
} > "$out/profile.txt"
cat "$out/profile.txt"
echo "profile-host: $out/profile.txt (the soak's own report: $out/soak/report.md)"
