#!/usr/bin/env bash
# Builds the worker host's container image (Dockerfile) with docker or podman.
#
#   scripts/image.sh                         release build here, then the image from it
#   scripts/image.sh --binary PATH           the image from a binary built elsewhere (CI's debug
#                                            build, say); it is copied in as it is
#   scripts/image.sh --from-source           the Dockerfile's multi-stage build (rust:1-bookworm
#                                            builder, debian:bookworm-slim runtime): needs an
#                                            image registry
#
#   --tag NAME        the image's name (default localhost/worker-host:<version>)
#   --engine E        docker or podman (default: docker if `docker info` answers, else podman,
#                     installed with apt-get when missing)
#   --base IMAGE      the runtime's base image for the prebuilt way (default: debian:bookworm-slim
#                     when the registry answers, else localhost/worker-host-base:bookworm, made
#                     here from Debian's packages with debootstrap and reused once it exists)
#   --print-env       print `export` lines for the tests on stdout (WH_TEST_IMAGE,
#                     WH_TEST_BASE_IMAGE, WH_TEST_ENGINE, and CONTAINERS_CONF when this
#                     repository's podman settings are in use); everything else goes to stderr:
#                       eval "$(scripts/image.sh --binary target/debug/worker-host --print-env)"
#
# Which of the two ways it took, the base and the image's size are printed at the end.
# Environment: WH_REGISTRY_URL (the registry probed, default https://registry-1.docker.io/v2/),
# WH_DEBIAN_MIRROR (debootstrap's mirror, default http://deb.debian.org/debian).
set -euo pipefail

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BASE_TAG=localhost/worker-host-base:bookworm
REGISTRY_URL=${WH_REGISTRY_URL:-https://registry-1.docker.io/v2/}
DEBIAN_MIRROR=${WH_DEBIAN_MIRROR:-http://deb.debian.org/debian}

say() { echo "image: $*" >&2; }
die() { echo "image: error: $*" >&2; exit 1; }

binary=""
tag=""
engine=""
base=""
from_source=0
print_env=0
while [ $# -gt 0 ]; do
    case $1 in
        --binary) [ $# -ge 2 ] || die "--binary needs a path"; binary=$2; shift 2 ;;
        --tag) [ $# -ge 2 ] || die "--tag needs a name"; tag=$2; shift 2 ;;
        --engine) [ $# -ge 2 ] || die "--engine needs docker or podman"; engine=$2; shift 2 ;;
        --base) [ $# -ge 2 ] || die "--base needs an image name"; base=$2; shift 2 ;;
        --from-source) from_source=1; shift ;;
        --print-env) print_env=1; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
[ "$from_source" = 1 ] && [ -n "$binary" ] && die "--from-source and --binary exclude each other"
[ "$from_source" = 1 ] && [ -n "$base" ] && die "--base is for the prebuilt way; --from-source uses debian:bookworm-slim"
if [ -n "$binary" ]; then
    [ -e "$binary" ] || die "--binary $binary: no such file"
    [ -f "$binary" ] && [ -x "$binary" ] || die "--binary $binary: not an executable file"
fi

cd "$REPO_DIR"
version=$(sed -n '/^\[workspace.package\]/,/^\[/ s/^version = "\(.*\)"/\1/p' Cargo.toml)
[ -n "$version" ] || die "no version in [workspace.package] of Cargo.toml"
# The checkout's commit; a tree with changes not committed is not the commit it names.
checkout_revision() {
    local head
    head=$(git rev-parse HEAD 2>/dev/null) || die "not a git checkout: no commit for the revision label"
    if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
        head="$head-dirty"
    fi
    echo "$head"
}
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
tag=${tag:-localhost/worker-host:$version}

# ------------------------------------------------------------------------------ the engine

install_podman() {
    local missing=()
    for tool in podman runc debootstrap; do
        command -v "$tool" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    command -v apt-get >/dev/null 2>&1 || die "no docker engine answers, ${missing[*]} missing and no apt-get here to install them"
    local sudo=()
    [ "$(id -u)" = 0 ] || sudo=(sudo)
    say "installing ${missing[*]} with apt-get"
    "${sudo[@]}" apt-get update -q >&2 &&
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            podman runc debootstrap >&2 ||
        die "apt-get install podman runc debootstrap failed"
}

docker_answers() { timeout 10 docker info >/dev/null 2>&1; }

case $engine in
    docker)
        docker_answers || die "--engine docker: \`docker info\` does not answer (no Docker engine behind the client?)"
        ;;
    podman) install_podman ;;
    "")
        if command -v docker >/dev/null 2>&1 && docker_answers; then
            engine=docker
        else
            say "no Docker engine answers \`docker info\`: using podman"
            engine=podman
            install_podman
        fi
        ;;
    *) die "--engine must be docker or podman, not '$engine'" ;;
esac

conf_env=""
if [ "$engine" = podman ]; then
    # Podman reads CONTAINERS_CONF instead of /etc/containers/containers.conf: the machine's
    # own settings win when it has them; else this repository's (deploy/podman/containers.conf).
    if [ -z "${CONTAINERS_CONF:-}" ] && [ ! -e /etc/containers/containers.conf ]; then
        export CONTAINERS_CONF=$REPO_DIR/deploy/podman/containers.conf
        conf_env=$CONTAINERS_CONF
        say "podman settings: $CONTAINERS_CONF (no /etc/containers/containers.conf here)"
    fi
    timeout 60 podman info >/dev/null 2>&1 || die "\`podman info\` fails: $(timeout 60 podman info 2>&1 | tail -n 1)"
fi

image_exists() {
    if [ "$engine" = podman ]; then podman image exists "$1"; else docker image inspect "$1" >/dev/null 2>&1; fi
}

registry_answers() {
    command -v curl >/dev/null 2>&1 || die "curl is missing: it checks whether an image registry answers"
    # Any HTTP answer (a registry says 401 to an anonymous /v2/) means it is reachable.
    local code
    code=$(curl -s -o /dev/null -w '%{http_code}' --connect-timeout 5 --max-time 8 "$REGISTRY_URL" 2>/dev/null) || true
    [ -n "$code" ] && [ "$code" != 000 ]
}

# ------------------------------------------------------------------------------ the base

# A Debian bookworm base from Debian's own packages (debootstrap minbase), with what a
# runtime image never reads removed: apt's caches and lists, docs (but the copyright
# files), man and info pages, locales, logs. dpkg keeps later installs just as slim.
make_debootstrap_base() {
    command -v debootstrap >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v debootstrap >/dev/null 2>&1 ||
        die "debootstrap is missing (apt-get install debootstrap)"
    [ "$(id -u)" = 0 ] || die "making the base image with debootstrap needs root"
    local root started
    root=$(mktemp -d -t worker-host-base.XXXXXX)
    # shellcheck disable=SC2064 # the path is fixed now
    trap "rm -rf '$root'" EXIT
    started=$(date +%s)
    say "making $BASE_TAG with debootstrap --variant=minbase bookworm from $DEBIAN_MIRROR (about a minute)"
    PATH="$PATH:/usr/sbin:/sbin" debootstrap --variant=minbase --include=ca-certificates \
        bookworm "$root" "$DEBIAN_MIRROR" >"$root.log" 2>&1 || {
        tail -n 20 "$root.log" | sed 's/^/    /' >&2
        die "debootstrap bookworm from $DEBIAN_MIRROR failed (log: $root.log)"
    }
    cat >"$root/etc/apt/sources.list" <<EOF
deb $DEBIAN_MIRROR bookworm main
deb $DEBIAN_MIRROR bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
    cat >"$root/etc/dpkg/dpkg.cfg.d/01-worker-host-slim" <<'EOF'
# Nothing in a runtime image reads these (scripts/image.sh).
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-include=/usr/share/locale/locale.alias
path-exclude=/usr/share/lintian/*
EOF
    cat >"$root/etc/apt/apt.conf.d/01-worker-host-slim" <<'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
EOF
    find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
    find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
    rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/lintian \
        "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* \
        "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old "$root"/var/log/* \
        "$root"/var/cache/ldconfig/aux-cache "$root"/debootstrap
    tar --numeric-owner -C "$root" -c . | $engine import \
        --change 'CMD ["/bin/bash"]' - "$BASE_TAG" >/dev/null ||
        die "$engine import of the debootstrap root as $BASE_TAG failed"
    rm -rf "$root" "$root.log"
    trap - EXIT
    say "made $BASE_TAG in $(($(date +%s) - started)) s"
}

# ------------------------------------------------------------------------------ the build

# The Dockerfile's LABELs take these from its ARGs.
set_build_args() {
    build_args=(--build-arg "VERSION=$version" --build-arg "REVISION=$revision" --build-arg "CREATED=$created")
}
format=()
# Podman's own image format (OCI) has no HEALTHCHECK: only the docker format keeps it. And
# podman's layer cache reuses a LABEL step whose ARG values changed, --label options and all
# (seen with podman 4.3.1: a new binary's image kept the previous commit's revision): no cache,
# which costs about a second here (the user's RUN step).
[ "$engine" = podman ] && format=(--format docker --no-cache --layers=false)
# The image the tag names now, removed once the tag moves (each test image is ~200 MB).
previous=$($engine image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
started=$(date +%s)

if [ "$from_source" = 1 ]; then
    registry_answers || die "--from-source needs rust:1-bookworm and debian:bookworm-slim, but the registry $REGISTRY_URL does not answer; build a binary here and use the default (or --binary PATH)"
    revision=$(checkout_revision)
    set_build_args
    way="from source: the Dockerfile's multi-stage build (rust:1-bookworm builder, debian:bookworm-slim runtime)"
    say "building $tag $way"
    $engine build "${format[@]}" --network host "${build_args[@]}" --target from-source \
        -t "$tag" -f Dockerfile . >&2 || die "$engine build (from source) failed"
else
    if [ -z "$base" ]; then
        if registry_answers; then
            base=docker.io/library/debian:bookworm-slim
        else
            say "no image registry answers ($REGISTRY_URL): the base comes from Debian's packages ($BASE_TAG)"
            base=$BASE_TAG
            if image_exists "$BASE_TAG"; then
                say "reusing $BASE_TAG"
            else
                make_debootstrap_base
            fi
        fi
    fi
    if [ -z "$binary" ]; then
        say "cargo build --release --locked -p worker-host"
        cargo build --release --locked -p worker-host >&2 || die "cargo build --release failed"
        binary=target/release/worker-host
        strip_it=1
    else
        strip_it=0
    fi
    # The labels name what the binary says it is (`--version`: its release and the commit
    # build.rs embedded), which may not be this checkout's HEAD for a binary built elsewhere.
    said=$(timeout 10 "$binary" --version 2>/dev/null | head -n 1 || true)
    if [[ $said =~ ^worker-host\ ([^ ]+)\ \(revision\ ([0-9a-f]{7,40})\)$ ]]; then
        [ "${BASH_REMATCH[1]}" = "$version" ] ||
            say "warning: the binary says version ${BASH_REMATCH[1]}, Cargo.toml $version: labelling ${BASH_REMATCH[1]}"
        version=${BASH_REMATCH[1]}
        revision=${BASH_REMATCH[2]}
    else
        revision=$(checkout_revision)
        say "warning: $binary --version names no revision ('$said'): labelling it with this checkout's, $revision"
    fi
    set_build_args
    context=$(mktemp -d -t worker-host-image.XXXXXX)
    # shellcheck disable=SC2064 # the path is fixed now
    trap "rm -rf '$context'" EXIT
    mkdir -p "$context/config"
    cp "$binary" "$context/worker-host"
    # The release build is stripped (3 MB of symbols); a given binary is taken as it is (a
    # debug build keeps its line tables for backtraces).
    stripped=""
    if [ "$strip_it" = 1 ]; then
        strip "$context/worker-host"
        stripped=" (stripped)"
    fi
    cp config/automations.demo.toml "$context/config/"
    way="prebuilt: the binary $binary$stripped on $base"
    say "building $tag $way"
    $engine build "${format[@]}" --network host "${build_args[@]}" --build-arg "BASE_IMAGE=$base" \
        --target prebuilt -t "$tag" -f Dockerfile "$context" >&2 || die "$engine build (prebuilt) failed"
    rm -rf "$context"
    trap - EXIT
fi

size=$($engine image inspect --format '{{.Size}}' "$tag")
current=$($engine image inspect --format '{{.Id}}' "$tag")
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
    # Still used by a container or another tag: then it stays, and that is fine.
    $engine rmi "$previous" >/dev/null 2>&1 || true
fi
say "built $tag with $engine in $(($(date +%s) - started)) s"
say "way: $way"
say "size: $((size / 1000000)) MB ($size bytes); revision $revision"
if [ "$print_env" = 1 ]; then
    echo "export WH_TEST_IMAGE=$tag"
    echo "export WH_TEST_ENGINE=$engine"
    [ "$from_source" = 1 ] && base=docker.io/library/debian:bookworm-slim
    echo "export WH_TEST_BASE_IMAGE=$base"
    [ -n "$conf_env" ] && echo "export CONTAINERS_CONF=$conf_env"
fi
exit 0
