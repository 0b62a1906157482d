# syntax=docker/dockerfile:1
# The worker host in a small runtime image, built from this repository.
#
#   docker build -t worker-host .
#   docker run --rm -e WORKER_HOST__DATABASE__HOST=db.example -e ... worker-host
#
# Settings come from the environment (WORKER_HOST__SECTION__KEY, see the README) and, when
# WORKER_HOST_CONFIG names one, a settings file mounted into the container; the migrations
# are inside the binary. `docker compose up --scale worker-host=3` runs three replicas
# against the compose file's services (docker-compose.yml).

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p worker-host \
 && strip target/release/worker-host

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin worker-host
COPY --from=build /src/target/release/worker-host /usr/local/bin/worker-host
COPY config/automations.demo.toml /etc/worker-host/automations.demo.toml
USER worker-host
WORKDIR /etc/worker-host
# The admin endpoints and the console; in a container they listen on every address, which
# the host allows only with an operator token (WORKER_HOST__ADMIN__OPERATOR_TOKEN).
EXPOSE 9180
ENTRYPOINT ["/usr/local/bin/worker-host"]
CMD ["run"]
