#!/usr/bin/env bash
# Starts (or reuses) the local services, then runs the host in the foreground with
# config/worker-host.toml. Ctrl-C stops the host cleanly; the services keep running
# (`scripts/services.sh down` stops them).
#
#   scripts/run.sh                 the host, `run` command
#   scripts/run.sh config check    any other worker-host command line
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/services.sh up
cargo build --locked -p worker-host
exec target/debug/worker-host "$@"
