//! The metric names and labels, documented once: what the README, the alert rules
//! (`deploy/prometheus/`) and the dashboard (`deploy/grafana/`) read.
//!
//! Names follow Prometheus's conventions: base units in the name (`_seconds`), `_total` on
//! counters, `_timestamp_seconds` on points in time, no label that grows with traffic (no
//! message ids). A renamed series is still emitted under its old name for one release
//! ([`DEPRECATED`]), and the changelog lists it.

/// The label naming a worker job (`email-send`, `draft-expiry`, ...). Not `job`: Prometheus
/// gives every scraped series the `job` of its scrape target and renames a scraped `job` to
/// `exported_job`, so a worker job's own label must have a name of its own.
pub const JOB_LABEL: &str = "worker_job";
/// The label the worker job had before [`JOB_LABEL`], still on the series that had it, with
/// the same value, until [`DEPRECATED_UNTIL`].
pub const DEPRECATED_JOB_LABEL: &str = "job";

/// The release that stops emitting what [`DEPRECATED`] lists.
pub const DEPRECATED_UNTIL: &str = "0.2.0";

/// A series or label kept under its old name beside the new one, until [`DEPRECATED_UNTIL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deprecation {
    pub old: &'static str,
    pub new: &'static str,
}

/// Every old name still emitted, with what replaced it.
pub const DEPRECATED: &[Deprecation] = &[
    Deprecation {
        old: BROKER_RECONNECTS_GAUGE,
        new: BROKER_RECONNECTS,
    },
    Deprecation {
        old: DEPRECATED_JOB_LABEL,
        new: JOB_LABEL,
    },
];

/// Counter: consumer deliveries settled, by `worker_job`, `queue` and `outcome` (`succeeded`,
/// `duplicate`, `skipped`, `parked`, `dead-lettered`, `requeued`, `abandoned`) and, for parked
/// and dead letters, `class` and `reason` (`malformed`, `rejected`, `gave-up`); for skips,
/// `reason` is why nothing was done (`no-match`, `loop-guard`, `recipient-cap`,
/// `reply-limit`, `expired`: a reply past `jobs.email_send.max_age` or its own limit).
pub const MESSAGES: &str = "worker_messages_total";
/// Counter: in-process tries that failed and were tried again, by `worker_job` and `class`.
pub const RETRIED_TRIES: &str = "worker_retried_tries_total";
/// Histogram (seconds): time from a delivery's start to its settlement, by `worker_job`.
pub const HANDLER_DURATION: &str = "worker_handler_duration_seconds";
/// Counter: timer ticks by `worker_job` and `outcome` (`ran`, `failed`, `skipped-busy`,
/// `skipped-lease`, `skipped-paused`, `cancelled`).
pub const TICKS: &str = "worker_ticks_total";
/// Histogram (seconds): duration of the timer ticks that ran, by `worker_job`.
pub const TICK_DURATION: &str = "worker_tick_duration_seconds";
/// Gauge: units of work running now, by `worker_job`.
pub const IN_FLIGHT: &str = "worker_in_flight";
/// Gauge: units of work (a handler's try, a tick) running past their timeout by more than
/// [`worker_core::liveness::OVERDUE_SLACK`], by `worker_job`: the timeout could not cancel
/// them, so a thread is wedged. systemd's watchdog is not fed while one is.
pub const OVERDUE_UNITS: &str = "worker_overdue_units";
/// Gauge (Unix seconds): when a tick of a timer job last ran (ran or failed) on this replica,
/// by `worker_job`; the process's start until one has.
pub const TIMER_LAST_RUN: &str = "worker_timer_last_run_timestamp_seconds";
/// Gauge (seconds): the nominal period of a timer job's schedule, by `worker_job`.
pub const TIMER_INTERVAL: &str = "worker_timer_interval_seconds";
/// Gauge: 1 while an operator has paused a timer job, else 0, by `worker_job`.
pub const TIMER_PAUSED: &str = "worker_timer_paused";
/// Gauge (seconds): how long an operator has had a job paused (`worker-host jobs pause`, the
/// console), timer or consumer, by `worker_job`; 0 while it is not paused. Read from the
/// shared database, so every replica reports the same pauses.
pub const JOB_PAUSED: &str = "worker_job_paused_seconds";
/// Gauge: messages ready in a consumer queue, by `queue`.
pub const QUEUE_DEPTH: &str = "worker_queue_depth";
/// Gauge: messages waiting in a queue's dead-letter queue, by `queue`.
pub const DEAD_LETTER_DEPTH: &str = "worker_dead_letter_depth";
/// Gauge: dead letters archived in the last minute, over all queues.
pub const DEAD_LETTER_INFLOW: &str = "worker_dead_letter_inflow_per_minute";
/// Gauge (seconds): age of the oldest dead letter waiting in the archive.
pub const DEAD_LETTER_OLDEST_AGE: &str = "worker_dead_letter_oldest_age_seconds";
/// Counter: dead letters archived, by `dead_queue`.
pub const DEAD_LETTERS_ARCHIVED: &str = "worker_dead_letters_archived_total";
/// Counter: rows the retention job deleted past their retention, by `table`
/// (`processed_messages`, `attempt_log`, `history_minutes`, `history_hours`, `history_days`,
/// `publications`, and `outbox` for the rows earlier releases marked processed); and
/// `audit_diff`: edits whose diff in the audit trail was redacted (the rows stay).
pub const RETENTION_SWEPT: &str = "worker_retention_swept_total";
/// Gauge: outbox rows waiting to be published.
pub const OUTBOX_PENDING: &str = "worker_outbox_pending";
/// Gauge: outbox rows that gave up (`failed`), waiting for an operator.
pub const OUTBOX_FAILED: &str = "worker_outbox_failed";
/// Gauge (seconds): age of the oldest pending outbox row (0 when none).
pub const OUTBOX_OLDEST_AGE: &str = "worker_outbox_oldest_pending_age_seconds";
/// Gauge (seconds): latency of the last database probe.
pub const DB_PROBE_LATENCY: &str = "worker_db_probe_latency_seconds";
/// Gauge: 1 while the last database probe succeeded, else 0.
pub const DB_HEALTHY: &str = "worker_db_healthy";
/// Gauge: database probes that failed in a row (0 after a success).
pub const DB_PROBE_FAILURES: &str = "worker_db_probe_consecutive_failures";
/// Gauge: 1 while the broker link is connected, else 0.
pub const BROKER_CONNECTED: &str = "worker_broker_connected";
/// Counter: reconnections of the broker link since start.
pub const BROKER_RECONNECTS: &str = "worker_broker_reconnects_total";
/// Gauge, deprecated for [`BROKER_RECONNECTS`]: the same count under its old name.
pub const BROKER_RECONNECTS_GAUGE: &str = "worker_broker_reconnects";
/// Gauge: stuck work by `kind` (`execution`, `email`): rows unfinished and unchanged for
/// longer than `jobs.reconciler.stuck_after`, with no live outbox row for their command.
pub const STUCK_WORK: &str = "worker_stuck_work";
/// Counter: outbound emails whose send outcome is unknown (no answer after the final "."
/// of DATA, or a stale `sending` claim taken over): each may have gone out twice.
pub const EMAIL_UNKNOWN_OUTCOMES: &str = "worker_email_unknown_outcomes_total";
/// Counter: what the delivery reports the poller read said, a recipient at a time, by `class`
/// (`permanent`: `5.x.x`, the mail will not arrive and is now `bounced`; `transient`: `4.x.x`
/// or delayed, the remote side still tries; `other`: delivered, relayed or expanded) and
/// `matched` (`true`: about a mail this host sent; `false`: about one it did not, backscatter
/// or a mail since erased). A report read again is not counted again.
pub const BOUNCES: &str = "worker_bounces_total";
/// Gauge: the replicas that report to the shared database, by `state`: `live` (reported
/// within `alerts.replica_silent_after`) or `silent` (stopped reporting without a clean stop).
pub const REPLICAS: &str = "worker_replicas";
/// Counter: token requests each `[oauth.NAME]` source made, by `source`: about one per
/// renewal (a third of a token's lifetime before it expires), not one per poll or mail.
pub const OAUTH_TOKEN_REQUESTS: &str = "worker_oauth_token_requests_total";
/// Gauge: 1 while a token source's last request failed, by `source` (the error is in the log
/// and in `worker-host mail-auth test`); its IMAP accounts and SMTP then wait.
pub const OAUTH_TOKEN_FAILING: &str = "worker_oauth_token_failing";
/// Gauge: 1 while a dependency's circuit is open, 0 while it is closed, by `dependency`
/// (`smtp-relay`, `imap:<account>`, `webhook:<host>`): every dependency this replica called or
/// saw open. Read from the shared database, so every replica reports the same open circuits.
pub const CIRCUIT_STATE: &str = "worker_circuit_state";
/// Counter: times this replica's failures opened a dependency's circuit, by `dependency`.
pub const CIRCUIT_OPENED: &str = "worker_circuit_opened_total";
/// Gauge, always 1: this process's `version`, `revision`, `installation` and `replica`.
pub const BUILD_INFO: &str = "worker_build_info";
