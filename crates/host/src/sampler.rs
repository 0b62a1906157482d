//! Readings taken on an interval: queue and dead-letter depths, dead-letter inflow, the
//! outbox, stuck work, the database probe and the broker link. They feed the gauges of `/metrics` (and
//! OTLP) and the alerts of `/status`. Taken once per interval, so a scrape never queries the
//! broker or the database.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::Utc;
use opentelemetry::KeyValue;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::alerts::AlertBook;
use crate::metrics::{Metrics, names};
use crate::settings::AlertSettings;

/// The latest readings. A value that could not be read this time keeps its last reading.
#[derive(Debug, Default, Clone)]
pub struct Readings {
    /// Ready messages per consumer queue, as the broker counts them.
    pub queue_depth: BTreeMap<String, u64>,
    /// Dead letters per queue: archived and waiting, plus those still in `Q.dead`.
    pub dead_letter_depth: BTreeMap<String, u64>,
    pub dead_letter_inflow_per_minute: u64,
    pub oldest_dead_letter_age: Option<Duration>,
    pub outbox_pending: u64,
    pub outbox_failed: u64,
    pub outbox_oldest_pending: Option<Duration>,
    pub db_latency: Option<Duration>,
    pub db_healthy: bool,
    pub db_consecutive_failures: u32,
    pub broker_connected: bool,
    pub broker_reconnects: u64,
    /// Stuck rows by kind (`execution`, `email`), as the reconciler defines them.
    pub stuck_work: BTreeMap<&'static str, u64>,
    /// `send_email` actions skipped in the last [`SKIP_WINDOW`], by kind (`reply-limit`,
    /// `loop-guard`, `recipient-cap`), over the whole installation.
    pub recent_skips: BTreeMap<String, u64>,
    /// The replicas reporting to the database, live and silent.
    pub replicas: worker_store::replicas::Census,
    /// Every queue of the topology with its retry tiers and dead queue, as the broker last
    /// counted them (`None` for a queue it did not answer for).
    pub queues: Vec<QueueReading>,
    /// The paused jobs, by their current name, with when each was paused.
    pub paused_since: BTreeMap<String, chrono::DateTime<Utc>>,
}

impl Readings {
    /// How long `job` has been paused at `now`; zero when it is not.
    pub fn paused_for(&self, job: &str, now: chrono::DateTime<Utc>) -> Duration {
        self.paused_since
            .get(job)
            .and_then(|since| (now - *since).to_std().ok())
            .unwrap_or_default()
    }
}

pub use worker_console::runtime::{QueueReading, TierReading};

/// What the sampler reads from.
#[derive(Debug, Clone)]
pub struct Sources {
    pub pool: PgPool,
    pub supervisor: worker_broker::Supervisor,
    pub health: job_db_health::HealthHandle,
    /// `jobs.reconciler.stuck_after`: what counts as stuck.
    pub stuck_after: Duration,
    /// This replica, as it reports itself on every round (the console lists them).
    pub replica: worker_store::replicas::Replica,
    /// `alerts.replica_silent_after`: how long a replica may go without reporting.
    pub replica_silent_after: Duration,
}

/// Registers the gauges over `readings` on the meter. The callbacks read the last readings.
pub fn register_gauges(metrics: &Metrics, readings: Arc<RwLock<Readings>>) {
    let meter = &metrics.meter;
    let read = move || readings.read().map(|r| r.clone()).unwrap_or_default();
    let r = read.clone();
    meter
        .u64_observable_gauge(names::QUEUE_DEPTH)
        .with_description("messages ready in a consumer queue")
        .with_callback(move |o| {
            for (queue, depth) in r().queue_depth {
                o.observe(depth, &[KeyValue::new("queue", queue)]);
            }
        })
        .build();
    let r = read.clone();
    meter
        .u64_observable_gauge(names::DEAD_LETTER_DEPTH)
        .with_description("dead letters waiting, archived or still in the dead queue")
        .with_callback(move |o| {
            for (queue, depth) in r().dead_letter_depth {
                o.observe(depth, &[KeyValue::new("queue", queue)]);
            }
        })
        .build();
    let r = read.clone();
    meter
        .u64_observable_gauge(names::DEAD_LETTER_INFLOW)
        .with_description("dead letters archived in the last minute")
        .with_callback(move |o| o.observe(r().dead_letter_inflow_per_minute, &[]))
        .build();
    let r = read.clone();
    meter
        .f64_observable_gauge(names::DEAD_LETTER_OLDEST_AGE)
        .with_unit("s")
        .with_description("age of the oldest dead letter waiting")
        .with_callback(move |o| {
            o.observe(
                r().oldest_dead_letter_age.map_or(0.0, |d| d.as_secs_f64()),
                &[],
            )
        })
        .build();
    let r = read.clone();
    meter
        .u64_observable_gauge(names::OUTBOX_PENDING)
        .with_description("outbox rows waiting to be published")
        .with_callback(move |o| o.observe(r().outbox_pending, &[]))
        .build();
    let r = read.clone();
    meter
        .u64_observable_gauge(names::OUTBOX_FAILED)
        .with_description("outbox rows that gave up")
        .with_callback(move |o| o.observe(r().outbox_failed, &[]))
        .build();
    let r = read.clone();
    meter
        .f64_observable_gauge(names::OUTBOX_OLDEST_AGE)
        .with_unit("s")
        .with_description("age of the oldest pending outbox row")
        .with_callback(move |o| {
            o.observe(
                r().outbox_oldest_pending.map_or(0.0, |d| d.as_secs_f64()),
                &[],
            )
        })
        .build();
    let r = read.clone();
    meter
        .f64_observable_gauge(names::DB_PROBE_LATENCY)
        .with_unit("s")
        .with_description("latency of the last database probe")
        .with_callback(move |o| o.observe(r().db_latency.map_or(0.0, |d| d.as_secs_f64()), &[]))
        .build();
    let r = read.clone();
    meter
        .u64_observable_gauge(names::DB_HEALTHY)
        .with_description("1 while the last database probe succeeded")
        .with_callback(move |o| o.observe(u64::from(r().db_healthy), &[]))
        .build();
    let r = read.clone();
    meter
        .u64_observable_gauge(names::DB_PROBE_FAILURES)
        .with_description("database probes that failed in a row")
        .with_callback(move |o| o.observe(u64::from(r().db_consecutive_failures), &[]))
        .build();
    let r = read.clone();
    meter
        .f64_observable_gauge(names::JOB_PAUSED)
        .with_unit("s")
        .with_description("how long an operator has had the job paused (0 while it is not)")
        .with_callback(move |o| {
            let readings = r();
            let now = Utc::now();
            for spec in crate::settings::all() {
                o.observe(
                    readings.paused_for(spec.name, now).as_secs_f64(),
                    &[KeyValue::new(names::JOB_LABEL, spec.name)],
                );
            }
        })
        .build();
    let r = read.clone();
    meter
        .u64_observable_gauge(names::REPLICAS)
        .with_description("replicas reporting to the shared database, by state")
        .with_callback(move |o| {
            let census = r().replicas;
            o.observe(census.live, &[KeyValue::new("state", "live")]);
            o.observe(census.silent, &[KeyValue::new("state", "silent")]);
        })
        .build();
    let r = read.clone();
    meter
        .u64_observable_gauge(names::BROKER_CONNECTED)
        .with_description("1 while the broker link is connected")
        .with_callback(move |o| o.observe(u64::from(r().broker_connected), &[]))
        .build();
    let r = read.clone();
    meter
        .u64_observable_gauge(names::STUCK_WORK)
        .with_description("executions and emails stuck unfinished with no command queued")
        .with_callback(move |o| {
            for (kind, count) in r().stuck_work {
                o.observe(count, &[KeyValue::new("kind", kind)]);
            }
        })
        .build();
    let r = read.clone();
    meter
        .u64_observable_counter(names::BROKER_RECONNECTS)
        .with_description("reconnections of the broker link since start")
        .with_callback(move |o| o.observe(r().broker_reconnects, &[]))
        .build();
    let r = read;
    meter
        .u64_observable_gauge(names::BROKER_RECONNECTS_GAUGE)
        .with_description(
            "deprecated for worker_broker_reconnects_total (dropped in 0.2.0): \
             reconnections of the broker link since start",
        )
        .with_callback(move |o| o.observe(r().broker_reconnects, &[]))
        .build();
}

/// Takes the readings every `settings.interval` until `shutdown`, and evaluates the alerts.
pub async fn run(
    sources: Sources,
    readings: Arc<RwLock<Readings>>,
    alerts: Arc<AlertBook>,
    settings: AlertSettings,
    shutdown: CancellationToken,
) {
    // The first readings wait for the broker link (bounded), so that the queue-depth gauges
    // are there from the first scrape rather than one interval later.
    let mut link = sources.supervisor.status();
    tokio::select! {
        _ = shutdown.cancelled() => return,
        _ = tokio::time::timeout(Duration::from_secs(10), link.wait_for(|s| s.is_ready())) => {}
    }
    let mut interval = tokio::time::interval(settings.interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = interval.tick() => {}
        }
        let previous = readings.read().map(|r| r.clone()).unwrap_or_default();
        let fresh = sample(&sources, previous).await;
        evaluate(&alerts, &settings, &fresh);
        if let Ok(mut slot) = readings.write() {
            *slot = fresh;
        }
    }
}

/// One round of readings; what cannot be read keeps `previous`'s value.
pub async fn sample(sources: &Sources, previous: Readings) -> Readings {
    let mut r = previous;
    let status = sources.supervisor.status().borrow().clone();
    r.broker_connected = status.is_ready();
    r.broker_reconnects = status.reconnects;
    let health = sources.health.snapshot();
    r.db_healthy = health.healthy;
    r.db_latency = health.latency;
    r.db_consecutive_failures = health.consecutive_failures;

    let pool = &sources.pool;
    if let Ok(outbox) = worker_store::outbox::status(pool).await {
        r.outbox_pending = u64::try_from(outbox.pending).unwrap_or_default();
        r.outbox_failed = u64::try_from(outbox.failed).unwrap_or_default();
        r.outbox_oldest_pending = outbox.oldest_pending_age;
    }
    let archived: BTreeMap<String, u64> = match job_dead_letter_archive::depth_by_queue(pool).await
    {
        Ok(depths) => depths
            .into_iter()
            .map(|d| (d.queue, u64::try_from(d.dead).unwrap_or_default()))
            .collect(),
        Err(_) => r.dead_letter_depth.clone(),
    };
    if let Ok(stuck) = job_reconciler::count_stuck(pool, sources.stuck_after).await {
        for kind in job_reconciler::WorkKind::ALL {
            r.stuck_work.insert(kind.as_str(), stuck.get(kind));
        }
    }
    if let Ok(skips) = job_automation_action::skips_since(pool, Utc::now() - SKIP_WINDOW).await {
        r.recent_skips = skips;
    }
    if let Ok(age) = job_dead_letter_archive::oldest_age(pool).await {
        r.oldest_dead_letter_age = age;
    }
    if let Ok(inflow) =
        job_dead_letter_archive::inflow_since(pool, Utc::now() - chrono::Duration::minutes(1)).await
    {
        r.dead_letter_inflow_per_minute = inflow;
    }

    if let Err(e) = worker_store::replicas::report(pool, &sources.replica).await {
        tracing::debug!(error = %e, "this replica's report to the database failed; trying again next round");
    }
    if let Ok(paused) = worker_store::pauses::list(pool).await {
        // A pause under a job's earlier name is its pause.
        r.paused_since = paused
            .into_iter()
            .map(|p| {
                let job = crate::settings::find(&p.job).map_or(p.job, |spec| spec.name.into());
                (job, p.paused_at)
            })
            .collect();
    }
    if let Ok(census) = worker_store::replicas::census(pool, sources.replica_silent_after).await {
        r.replicas = census;
    }

    let mut dead = archived;
    if let Some(depths) = broker_depths(&sources.supervisor).await {
        r.queues = queue_readings(sources.supervisor.topology(), &depths);
        for queue in &sources.supervisor.topology().queues {
            if let Some(depth) = depths.get(&queue.name) {
                r.queue_depth.insert(queue.name.clone(), *depth);
            }
            // Not yet archived: still in the dead queue.
            if let Some(waiting) = depths.get(&queue.dead_queue) {
                *dead.entry(queue.name.clone()).or_default() += waiting;
            }
        }
    }
    r.dead_letter_depth = dead;
    r
}

fn queue_readings(
    topology: &worker_broker::Topology,
    depths: &BTreeMap<String, u64>,
) -> Vec<QueueReading> {
    topology
        .queues
        .iter()
        .map(|queue| QueueReading {
            queue: queue.name.clone(),
            ready: depths.get(&queue.name).copied(),
            tiers: queue
                .tiers
                .iter()
                .map(|tier| TierReading {
                    queue: tier.queue.clone(),
                    delay: tier.delay,
                    parked: depths.get(&tier.queue).copied(),
                })
                .collect(),
            dead_queue: queue.dead_queue.clone(),
            dead_waiting: depths.get(&queue.dead_queue).copied(),
        })
        .collect()
}

/// The broker's count of ready messages in each consumer queue, retry tier and dead queue, through a
/// passive declare on a short-lived channel; `None` while the link is down.
async fn broker_depths(supervisor: &worker_broker::Supervisor) -> Option<BTreeMap<String, u64>> {
    let session = supervisor.sessions().borrow().clone()?;
    let topology = supervisor.topology();
    // Collected first: an iterator adapter's closure held across the await would make the
    // future's `Send` depend on a lifetime the spawn cannot name.
    let names: Vec<&str> = topology
        .queues
        .iter()
        .flat_map(|q| {
            std::iter::once(q.name.as_str())
                .chain(q.tiers.iter().map(|t| t.queue.as_str()))
                .chain(std::iter::once(q.dead_queue.as_str()))
        })
        .collect();
    session.queue_depths(names).await
}

/// Compares the readings with the thresholds; each crossing and clearing is logged once.
/// The window of [`Readings::recent_skips`], and of the reply-limit alert's count.
pub const SKIP_WINDOW: chrono::Duration = chrono::Duration::minutes(10);

pub fn evaluate(alerts: &AlertBook, settings: &AlertSettings, r: &Readings) {
    alerts.evaluate(
        "reply-limit-skips",
        "replies the reply limit held back in the last 10 minutes",
        r.recent_skips
            .get(job_automation_action::SkipKind::ReplyLimit.as_str())
            .copied()
            .unwrap_or_default() as f64,
        settings.reply_limit_skips as f64,
    );
    for (queue, depth) in &r.dead_letter_depth {
        alerts.evaluate(
            &format!("dead-letter-depth:{queue}"),
            &format!("dead letters waiting for queue {queue}"),
            *depth as f64,
            settings.dead_letter_depth as f64,
        );
    }
    alerts.evaluate(
        "dead-letter-inflow",
        "dead letters archived in the last minute",
        r.dead_letter_inflow_per_minute as f64,
        settings.dead_letter_inflow_per_minute as f64,
    );
    alerts.evaluate(
        "dead-letter-oldest-age",
        "seconds the oldest dead letter has waited for an operator",
        r.oldest_dead_letter_age
            .map_or(0.0, |d| d.as_secs().min(u64::from(u32::MAX)) as f64),
        settings.dead_letter_oldest_age.as_secs() as f64,
    );
    alerts.evaluate(
        "outbox-pending",
        "outbox rows waiting to be published",
        r.outbox_pending as f64,
        settings.outbox_pending as f64,
    );
    alerts.evaluate(
        "outbox-failed",
        "outbox rows that gave up, waiting for an operator",
        r.outbox_failed as f64,
        settings.outbox_failed as f64,
    );
    alerts.evaluate(
        "replicas-silent",
        "replicas that stopped reporting without a clean stop",
        r.replicas.silent as f64,
        0.0,
    );
    alerts.evaluate(
        "outbox-oldest-pending",
        "seconds the oldest pending outbox row has waited",
        r.outbox_oldest_pending
            .map_or(0.0, |d| d.as_secs().min(u64::from(u32::MAX)) as f64),
        settings.outbox_oldest_pending.as_secs() as f64,
    );
    for (kind, count) in &r.stuck_work {
        alerts.evaluate(
            &format!("stuck-work:{kind}"),
            &format!("{kind}s stuck unfinished with no command queued"),
            *count as f64,
            settings.stuck_work as f64,
        );
    }
    let now = Utc::now();
    for spec in crate::settings::all() {
        alerts.evaluate(
            &format!("job-paused:{}", spec.name),
            &format!("seconds job {} has been paused", spec.name),
            r.paused_for(spec.name, now).as_secs() as f64,
            settings.pause_age.as_secs() as f64,
        );
    }
    alerts.evaluate(
        "db-probe-failures",
        "failed database probes in a row",
        f64::from(r.db_consecutive_failures),
        f64::from(settings.db_probe_failures),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_older_than_pause_age_is_an_alert_for_its_job() {
        let alerts = AlertBook::default();
        let settings = AlertSettings {
            pause_age: Duration::from_secs(3600),
            ..AlertSettings::default()
        };
        let mut r = Readings::default();
        r.paused_since.insert(
            "email-send".into(),
            Utc::now() - chrono::Duration::minutes(61),
        );
        r.paused_since.insert(
            "draft-expiry".into(),
            Utc::now() - chrono::Duration::minutes(5),
        );
        evaluate(&alerts, &settings, &r);
        let names: Vec<String> = alerts
            .active()
            .into_iter()
            .map(|a| a.name)
            .filter(|n| n.starts_with("job-paused"))
            .collect();
        assert_eq!(names, vec!["job-paused:email-send".to_string()]);
        r.paused_since.clear();
        evaluate(&alerts, &settings, &r);
        assert!(
            alerts
                .active()
                .iter()
                .all(|a| !a.name.starts_with("job-paused"))
        );
    }

    #[test]
    fn dead_letter_depth_over_its_threshold_is_an_alert_per_queue() {
        let alerts = AlertBook::default();
        let settings = AlertSettings {
            dead_letter_depth: 10,
            ..AlertSettings::default()
        };
        let mut r = Readings::default();
        r.dead_letter_depth.insert("email.send".into(), 11);
        r.dead_letter_depth.insert("automation.action".into(), 3);
        evaluate(&alerts, &settings, &r);
        let active = alerts.active();
        assert_eq!(active.len(), 1);
        assert_eq!(active[0].name, "dead-letter-depth:email.send");
        r.dead_letter_depth.insert("email.send".into(), 0);
        evaluate(&alerts, &settings, &r);
        assert!(alerts.active().is_empty());
    }

    #[test]
    fn reply_limit_skips_over_the_threshold_are_an_alert_and_other_skips_are_not() {
        let alerts = AlertBook::default();
        let settings = AlertSettings::default();
        let mut r = Readings::default();
        r.recent_skips
            .insert("reply-limit".into(), settings.reply_limit_skips);
        r.recent_skips.insert("loop-guard".into(), 500);
        evaluate(&alerts, &settings, &r);
        assert!(
            alerts.active().is_empty(),
            "at the threshold, and loop-guard skips are not counted"
        );
        r.recent_skips
            .insert("reply-limit".into(), settings.reply_limit_skips + 1);
        evaluate(&alerts, &settings, &r);
        let active = alerts.active();
        assert_eq!(active.len(), 1, "{active:?}");
        assert_eq!(active[0].name, "reply-limit-skips");
        assert!(
            active[0].message.contains("reply limit"),
            "{}",
            active[0].message
        );
    }

    #[test]
    fn any_stuck_work_is_an_alert_per_kind_by_default() {
        let alerts = AlertBook::default();
        let settings = AlertSettings::default();
        let mut r = Readings::default();
        r.stuck_work.insert("execution", 0);
        r.stuck_work.insert("email", 2);
        evaluate(&alerts, &settings, &r);
        let active = alerts.active();
        assert_eq!(active.len(), 1, "{active:?}");
        assert_eq!(active[0].name, "stuck-work:email");
        assert!(
            active[0].message.contains("emails stuck"),
            "{}",
            active[0].message
        );
        r.stuck_work.insert("email", 0);
        evaluate(&alerts, &settings, &r);
        assert!(alerts.active().is_empty());
    }
}
