# Everyday commands. Each is a short name for a script or cargo command; the README's two
# commands are `just run` and `just test`.

# Start (or reuse) the local services and run the host in the foreground.
run *ARGS:
    scripts/run.sh {{ARGS}}

# The whole test suite, services included (what CI runs).
test *ARGS:
    scripts/test.sh {{ARGS}}

# Start, stop or inspect the local services.
services-up:
    scripts/services.sh up
services-down:
    scripts/services.sh down
services-status:
    scripts/services.sh status

# Validate the settings and print them with secrets redacted.
config-check:
    cargo run -q -p worker-host -- config check

# Apply the database migrations.
migrate:
    cargo run -q -p worker-host -- migrate

# The fault suite (its quick run is part of `just test`): `just faults --quick`, `just faults --scenario host-kill9`.
faults *ARGS:
    scripts/faults.sh {{ARGS}}

# Formatting and lints, as the test command checks them.
lint:
    cargo fmt --all --check
    cargo clippy --workspace --all-targets -- -D warnings

fmt:
    cargo fmt --all

# With the host running: mail the demo account a ping and print the reply.
demo:
    scripts/demo-mail.sh

# The running host's status (jobs, broker, database, alerts).
status:
    cargo run -q -p worker-host -- status

# The dead-letter archive, per queue and fingerprint.
dlq-list:
    cargo run -q -p worker-host -- dlq list

# Pending and failed outbox rows.
outbox-status:
    cargo run -q -p worker-host -- outbox status
