#!/usr/bin/env bash
# The tools the deployment tests and scripts use, installed where missing:
#
#   podman, runc          a container engine for machines without a Docker engine (runc: podman's
#                         default runtime, crun, fails on some hybrid cgroup layouts)
#   debootstrap           the base image from Debian's packages where no image registry answers
#   podman-compose        checks docker-compose.yml (`--dry-run`) and runs it with podman
#   prometheus, promtool  the alert rules' checks and a real scraper
#   systemd-analyze       `verify` and `security` on deploy/systemd/worker-host.service
#   cargo-deb             the Debian package (scripts/package.sh), from crates.io
#   npm (with node)       installs axe-core from the npm registry for the console's accessibility
#                         test (scripts/test.sh runs `npm ci --prefix crates/testkit/axe`)
#
#   scripts/deploy-tools.sh          install what is missing (apt-get, cargo install); fast when
#                                    everything is there (no network then)
#   scripts/deploy-tools.sh --check  list what is missing, install nothing; exit 1 if anything is
#   scripts/deploy-tools.sh --cargo-deb  only cargo-deb (what scripts/package.sh needs)
#
# Run as root or as a user who may sudo (apt-get). Idempotent.
set -euo pipefail

# The cargo-deb release this repository's packaging is written and tested against.
CARGO_DEB_VERSION=3.8.0

say() { echo "deploy-tools: $*"; }
die() { echo "deploy-tools: error: $*" >&2; exit 1; }

check_only=0
only_cargo_deb=0
case "${1:-}" in
    --check) check_only=1 ;;
    --cargo-deb) only_cargo_deb=1 ;;
    "") ;;
    *) die "unknown argument '$1' (expected nothing, --check or --cargo-deb)" ;;
esac

export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

as_root() {
    if [ "$(id -u)" = 0 ]; then
        "$@"
    else
        command -v sudo >/dev/null 2>&1 || die "not root and sudo is missing: cannot run $1"
        sudo "$@"
    fi
}

# command -> the Debian package that brings it
declare -A package_of=(
    [podman]=podman
    [runc]=runc
    [debootstrap]=debootstrap
    [podman-compose]=podman-compose
    [prometheus]=prometheus
    [promtool]=prometheus
    [systemd-analyze]=systemd
    [npm]=npm
)

missing_packages=()
[ "$only_cargo_deb" = 1 ] && package_of=()
for command in "${!package_of[@]}"; do
    if ! command -v "$command" >/dev/null 2>&1; then
        package=${package_of[$command]}
        [[ " ${missing_packages[*]} " == *" $package "* ]] || missing_packages+=("$package")
    fi
done

cargo_deb_installed() {
    command -v cargo-deb >/dev/null 2>&1 &&
        [ "$(cargo-deb --version 2>/dev/null | awk '{print $2}')" = "$CARGO_DEB_VERSION" ]
}
need_cargo_deb=0
cargo_deb_installed || need_cargo_deb=1

if [ "$check_only" = 1 ]; then
    status=0
    if [ "${#missing_packages[@]}" -gt 0 ]; then
        say "missing Debian packages: ${missing_packages[*]}"
        status=1
    fi
    if [ "$need_cargo_deb" = 1 ]; then
        say "missing: cargo-deb $CARGO_DEB_VERSION"
        status=1
    fi
    [ "$status" = 0 ] && say "all present"
    exit "$status"
fi

if [ "${#missing_packages[@]}" -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 ||
        die "missing ${missing_packages[*]} and there is no apt-get here: install them by hand"
    log=$(mktemp -t deploy-tools-apt.XXXXXX.log)
    say "installing ${missing_packages[*]} with apt-get (log: $log)"
    # No recommends: podman's (buildah, fuse-overlayfs, slirp4netns, uidmap, dbus-user-session)
    # are for rootless use; the scripts run podman as root with --network host.
    {
        as_root apt-get update &&
            as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -o DPkg::Lock::Timeout=300 \
                --no-install-recommends "${missing_packages[@]}"
    } >>"$log" 2>&1 || {
        tail -n 20 "$log" | sed 's/^/    /' >&2
        die "apt-get install ${missing_packages[*]} failed; log: $log"
    }
    for command in "${!package_of[@]}"; do
        command -v "$command" >/dev/null 2>&1 ||
            die "$command is still missing after installing ${package_of[$command]}"
    done
fi

if [ "$need_cargo_deb" = 1 ]; then
    command -v cargo >/dev/null 2>&1 || die "cargo-deb is missing and so is cargo, which installs it"
    say "installing cargo-deb $CARGO_DEB_VERSION with cargo install (a few minutes on two cores)"
    cargo install --locked --quiet --version "$CARGO_DEB_VERSION" cargo-deb ||
        die "cargo install --locked --version $CARGO_DEB_VERSION cargo-deb failed"
    cargo_deb_installed ||
        die "cargo-deb $CARGO_DEB_VERSION is not on the PATH after cargo install (is ~/.cargo/bin on it?)"
fi
[ "$only_cargo_deb" = 1 ] && { say "cargo-deb $CARGO_DEB_VERSION present"; exit 0; }
say "all present (podman $(podman --version | awk '{print $3}'), podman-compose, debootstrap, prometheus, systemd-analyze, npm $(npm --version), cargo-deb $CARGO_DEB_VERSION)"
