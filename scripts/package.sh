#!/usr/bin/env bash
# Builds the Debian package worker-host_<version>-<revision>_amd64.deb with cargo-deb
# (installed by scripts/deploy-tools.sh --cargo-deb when missing). Its contents are in
# [package.metadata.deb] at the end of crates/host/Cargo.toml.
#
#   scripts/package.sh                   cargo deb: a release build, then the package
#   scripts/package.sh --profile NAME    the binary of another cargo profile (built by cargo deb;
#                                        not `dev`, which cargo-deb refuses to package)
#   scripts/package.sh --binary PATH     package a binary built elsewhere, as it is (CI's debug
#                                        build, say): no cargo build at all
#
#   --output DIR      where the .deb goes (default target/debian)
#   --fast            faster, larger compression (for test packages)
#   --print-env       print `export WH_TEST_DEB=<path>` on stdout for the tests; everything else
#                     goes to stderr:  eval "$(scripts/package.sh --binary target/debug/worker-host --fast --print-env)"
set -euo pipefail

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

say() { echo "package: $*" >&2; }
die() { echo "package: error: $*" >&2; exit 1; }

binary=""
profile=""
output=""
fast=()
print_env=0
while [ $# -gt 0 ]; do
    case $1 in
        --binary) [ $# -ge 2 ] || die "--binary needs a path"; binary=$2; shift 2 ;;
        --profile) [ $# -ge 2 ] || die "--profile needs a cargo profile name"; profile=$2; shift 2 ;;
        --output) [ $# -ge 2 ] || die "--output needs a folder"; output=$2; shift 2 ;;
        --fast) fast=(--fast); shift ;;
        --print-env) print_env=1; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
[ -n "$binary" ] && [ -n "$profile" ] && die "--binary and --profile exclude each other"
case $profile in
    dev | debug) die "--profile $profile: cargo-deb does not package the dev profile; build it and use --binary target/debug/worker-host" ;;
esac

cd "$REPO_DIR"
if ! command -v cargo-deb >/dev/null 2>&1; then
    say "cargo-deb is missing: installing it (scripts/deploy-tools.sh --cargo-deb, a few minutes)"
    "$REPO_DIR/scripts/deploy-tools.sh" --cargo-deb >&2 || die "cargo-deb could not be installed"
fi

output=${output:-$REPO_DIR/target/debian}
mkdir -p "$output" || die "cannot create the output folder $output"
output=$(cd "$output" && pwd)
started=$(date +%s)

if [ -n "$binary" ]; then
    [ -e "$binary" ] || die "--binary $binary: no such file"
    [ -f "$binary" ] && [ -x "$binary" ] || die "--binary $binary: not an executable file"
    # cargo-deb takes the binary from <target dir>/release/ (the `target/release/` of the
    # assets), and the target dir from CARGO_TARGET_DIR: a folder of our own holding only the
    # given binary there, so that nothing is built and nothing else is picked up.
    staging=$(mktemp -d -t worker-host-deb.XXXXXX)
    # shellcheck disable=SC2064 # the path is fixed now
    trap "rm -rf '$staging'" EXIT
    mkdir -p "$staging/release"
    cp "$binary" "$staging/release/worker-host"
    say "packaging the binary $binary (cargo deb --no-build)"
    CARGO_TARGET_DIR=$staging cargo deb -p worker-host --no-build --locked "${fast[@]}" \
        -o "$output" >"$staging/cargo-deb.out" || die "cargo deb --no-build failed (binary $binary)"
    deb=$(tail -n 1 "$staging/cargo-deb.out")
else
    args=(-p worker-host --locked "${fast[@]}" -o "$output")
    [ -n "$profile" ] && args+=(--profile "$profile")
    say "cargo deb ${args[*]}"
    log=$(mktemp -t worker-host-deb.XXXXXX.out)
    cargo deb "${args[@]}" >"$log" || die "cargo deb ${args[*]} failed"
    deb=$(tail -n 1 "$log")
    rm -f "$log"
fi
[ -f "$deb" ] || die "cargo deb printed no package path (last line: '$deb')"
say "built $deb ($(($(stat -c %s "$deb") / 1000)) kB) in $(($(date +%s) - started)) s"
[ "$print_env" = 1 ] && echo "export WH_TEST_DEB=$deb"
exit 0
