# syntax=docker/dockerfile:1
# The worker host in a small runtime image. scripts/image.sh builds it with docker or podman,
# whichever answers, and says which of the two ways below it took:
#
# 1. From source (the default target, `from-source`), on a machine that reaches an image
#    registry: the binary is built in rust:1-bookworm and copied onto debian:bookworm-slim.
#      docker build -t worker-host .
#
# 2. From a release binary built outside the image (target `prebuilt`), on any base image
#    with Debian's layout, e.g. one made with debootstrap where no registry answers. The
#    build context is a folder holding `worker-host` (the binary) and
#    `config/automations.demo.toml`; scripts/image.sh --binary PATH lays it out:
#      podman build --format docker --target prebuilt \
#        --build-arg BASE_IMAGE=localhost/worker-host-base:bookworm -f Dockerfile CONTEXT
#
#   docker run --rm --read-only -e WORKER_HOST__DATABASE__HOST=db.example -e ... worker-host
#
# Settings come from the environment (WORKER_HOST__SECTION__KEY, see docs/SETTINGS.md) and, when
# WORKER_HOST_CONFIG names one, a settings file mounted into the container; the migrations
# are inside the binary. The host writes no file at all, so the root file system can be
# read-only with no tmpfs. `docker compose up --scale worker-host=3` runs three replicas
# against the compose file's services (docker-compose.yml).

# Any image with Debian bookworm's layout (dpkg, apt, useradd). Full names: podman resolves
# no short name that its aliases do not list (rust is not among them).
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim

FROM docker.io/library/rust:1-bookworm AS build
ARG REVISION=unknown
WORKDIR /src
COPY . .
# The context has no git history (.dockerignore): build.rs embeds the commit given here
# (`worker-host --version`, /status, worker_build_info).
RUN WORKER_HOST_REVISION="${REVISION%-dirty}" cargo build --release --locked -p worker-host \
 && strip target/release/worker-host

# What both ways share: the user, the CA certificates, the labels, the health check.
FROM ${BASE_IMAGE} AS runtime
# The broker's TLS (lapin through rustls-native-certs) trusts the system's CA certificates,
# /etc/ssl/certs; a base made by scripts/image.sh has them already, and then this needs no
# network.
RUN if [ ! -s /etc/ssl/certs/ca-certificates.crt ]; then \
        apt-get update \
     && apt-get install -y --no-install-recommends ca-certificates \
     && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin; \
    fi \
 && groupadd --system --gid 10001 worker-host \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin worker-host
COPY config/automations.demo.toml /etc/worker-host/automations.demo.toml
ARG VERSION=unknown
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="worker-host" \
      org.opencontainers.image.description="The background-job runtime of a logistics platform's client installation: RabbitMQ consumers and timer jobs against PostgreSQL, IMAP and SMTP." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="https://github.com/logistics-platform/worker-host" \
      org.opencontainers.image.licenses="Apache-2.0"
# Numeric, so that a runtime can tell it is not root without reading /etc/passwd.
USER 10001:10001
WORKDIR /etc/worker-host
# The admin endpoints and the console, on admin.listen: loopback by default (with
# --network host, the machine's loopback); on a bridge network set admin.listen =
# "0.0.0.0:9180", which the host allows only with an operator token.
EXPOSE 9180
# The host is PID 1 and handles SIGTERM itself: it drains within workers.shutdown_grace
# (30 s by default) and exits 0. Give `docker stop -t` / `podman stop -t` more than that.
STOPSIGNAL SIGTERM
# `worker-host health` asks the admin endpoint's /readyz (admin.listen, from the same
# settings and environment as the host): exit 0 when ready, 1 otherwise. The start period
# covers migrations and the connect retries. Podman keeps it only with --format docker.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["/usr/local/bin/worker-host", "health"]
ENTRYPOINT ["/usr/local/bin/worker-host"]
CMD ["run"]

# The binary from the build context (`worker-host` at its top).
FROM runtime AS prebuilt
COPY --chmod=0755 worker-host /usr/local/bin/worker-host

# The last stage, the default target: the binary built above.
FROM runtime AS from-source
COPY --from=build /src/target/release/worker-host /usr/local/bin/worker-host
