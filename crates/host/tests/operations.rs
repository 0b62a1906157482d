//! Operating the host, with the real `worker-host` binary on the real services:
//!
//! - `a_dead_letter_depth_alert_is_logged_once_each_way_and_never_touches_readiness`: dead
//!   letters over `alerts.dead_letter_depth` raise `dead-letter-depth:email.send` on `/status`
//!   (with `/readyz` still 200) and one ERROR log line; `dlq purge` clears it, with one more
//!   line; nothing else is logged about it.
//! - `an_otlp_receiver_gets_the_same_metrics_as_the_metrics_endpoint`: with an OTLP endpoint
//!   and a short `metrics_interval`, a receiver gets `worker_ticks_total` for the timer jobs,
//!   every metric `/metrics` shows, and counts that agree with the scrape.
//! - `one_mail_through_the_loop_is_one_trace_from_the_poll_to_the_send`: the spans an OTLP
//!   receiver gets for one mail form one trace, each hop the child of the one before: poll,
//!   outbox publish, trigger, action, outbox publish, send.
//!
//! Each test runs its own host (own database, vhost, admin port, IMAP accounts), one test at a
//! time, with bounded waits, and stops it with SIGTERM (exit 0). A failed wait prints the tail
//! of the host's log; `OPERATIONS_SHOW_LOG=1` prints the whole log when a host stops.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use lapin::BasicProperties;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as NumberValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use support::{
    Host, SERIAL, base_settings, inbox_count, mail_account_settings, publish_confirmed, send_mail,
    short_id, write_automation,
};
use worker_testkit::{TestDb, TestVhost};

// ---------------------------------------------------------------------------------------------
// The host
// ---------------------------------------------------------------------------------------------

/// What a test's host is configured with beyond the database, vhost and admin port.
#[derive(Default)]
struct HostConfig {
    /// Lines under `[telemetry]` (the log format is always JSON).
    telemetry: String,
    /// Whole sections appended to the file.
    sections: String,
    /// An IMAP account (user name, password `secret`) the poller reads every second, and the
    /// demo automation.
    mail_account: Option<String>,
}

impl Host {
    /// Starts the host on the test's database and vhost and waits until `/readyz` is 200.
    async fn start(db: &TestDb, vhost: &TestVhost, extra: HostConfig) -> anyhow::Result<Self> {
        Self::launch("OPERATIONS_SHOW_LOG", |dir, port| {
            let mut mail = String::new();
            let mut automations = String::from("[]");
            if let Some(account) = &extra.mail_account {
                automations = write_automation(dir)?;
                mail = mail_account_settings(account);
            }
            let mut settings = base_settings("operations-test", &automations, db, vhost, port);
            settings.push_str(&format!(
                r#"
[telemetry]
log_format = "json"
{telemetry}
{mail}
{sections}
"#,
                telemetry = extra.telemetry,
                sections = extra.sections,
            ));
            Ok(settings)
        })
        .await
    }
}

// ---------------------------------------------------------------------------------------------
// The OTLP receiver
// ---------------------------------------------------------------------------------------------

/// What the receiver got: the export requests, in the order they arrived.
#[derive(Default)]
struct Received {
    traces: Vec<ExportTraceServiceRequest>,
    metrics: Vec<ExportMetricsServiceRequest>,
    /// Bodies that did not decode, by path.
    undecodable: Vec<String>,
}

type Shared = Arc<Mutex<Received>>;

/// An OTLP/HTTP (protobuf) receiver on a loopback port: `/v1/traces` and `/v1/metrics`.
struct Receiver {
    endpoint: String,
    received: Shared,
    server: tokio::task::JoinHandle<()>,
}

async fn receive_traces(State(received): State<Shared>, body: Bytes) -> &'static str {
    let mut received = received.lock().unwrap();
    match ExportTraceServiceRequest::decode(body) {
        Ok(request) => received.traces.push(request),
        Err(e) => received.undecodable.push(format!("/v1/traces: {e}")),
    }
    ""
}

async fn receive_metrics(State(received): State<Shared>, body: Bytes) -> &'static str {
    let mut received = received.lock().unwrap();
    match ExportMetricsServiceRequest::decode(body) {
        Ok(request) => received.metrics.push(request),
        Err(e) => received.undecodable.push(format!("/v1/metrics: {e}")),
    }
    ""
}

impl Receiver {
    async fn start() -> anyhow::Result<Self> {
        let received: Shared = Arc::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let app = Router::new()
            .route("/v1/traces", post(receive_traces))
            .route("/v1/metrics", post(receive_metrics))
            .with_state(received.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            endpoint,
            received,
            server,
        })
    }

    fn spans(&self) -> Vec<Span> {
        self.received
            .lock()
            .unwrap()
            .traces
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|rs| &rs.scope_spans)
            .flat_map(|ss| ss.spans.iter().cloned())
            .collect()
    }

    fn undecodable(&self) -> Vec<String> {
        self.received.lock().unwrap().undecodable.clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn attribute<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a AnyValue> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

/// An attribute as text, whatever its type.
fn text_attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    Some(match attribute(attributes, key)? {
        AnyValue::StringValue(s) => s.clone(),
        AnyValue::IntValue(i) => i.to_string(),
        AnyValue::DoubleValue(d) => d.to_string(),
        AnyValue::BoolValue(b) => b.to_string(),
        other => format!("{other:?}"),
    })
}

/// One number data point of an exported metric: its attributes as text, its value.
#[derive(Debug, Clone)]
struct Point {
    labels: BTreeMap<String, String>,
    value: f64,
}

/// The metrics of one export request by name, with their number data points (sums and
/// gauges; a histogram has its count as its value).
fn exported(request: &ExportMetricsServiceRequest) -> BTreeMap<String, Vec<Point>> {
    let mut out: BTreeMap<String, Vec<Point>> = BTreeMap::new();
    for metric in request
        .resource_metrics
        .iter()
        .flat_map(|rm| &rm.scope_metrics)
        .flat_map(|sm| &sm.metrics)
    {
        let labels = |attributes: &[KeyValue]| {
            attributes
                .iter()
                .filter_map(|kv| Some((kv.key.clone(), text_attribute(attributes, &kv.key)?)))
                .collect()
        };
        let number = |v: &Option<NumberValue>| match v {
            Some(NumberValue::AsInt(i)) => *i as f64,
            Some(NumberValue::AsDouble(d)) => *d,
            None => f64::NAN,
        };
        let points: Vec<Point> = match &metric.data {
            Some(Data::Sum(sum)) => sum
                .data_points
                .iter()
                .map(|p| Point {
                    labels: labels(&p.attributes),
                    value: number(&p.value),
                })
                .collect(),
            Some(Data::Gauge(gauge)) => gauge
                .data_points
                .iter()
                .map(|p| Point {
                    labels: labels(&p.attributes),
                    value: number(&p.value),
                })
                .collect(),
            Some(Data::Histogram(histogram)) => histogram
                .data_points
                .iter()
                .map(|p| Point {
                    labels: labels(&p.attributes),
                    value: p.count as f64,
                })
                .collect(),
            _ => Vec::new(),
        };
        out.entry(metric.name.clone()).or_default().extend(points);
    }
    out
}

/// When an export's data was collected: the latest `time_unix_nano` of its points.
fn collected_at(request: &ExportMetricsServiceRequest) -> u64 {
    request
        .resource_metrics
        .iter()
        .flat_map(|rm| &rm.scope_metrics)
        .flat_map(|sm| &sm.metrics)
        .flat_map(|metric| match &metric.data {
            Some(Data::Sum(sum)) => sum.data_points.iter().map(|p| p.time_unix_nano).collect(),
            Some(Data::Gauge(g)) => g.data_points.iter().map(|p| p.time_unix_nano).collect(),
            Some(Data::Histogram(h)) => h.data_points.iter().map(|p| p.time_unix_nano).collect(),
            _ => Vec::new(),
        })
        .max()
        .unwrap_or_default()
}

fn unix_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or_default()
}

/// The sum of the points whose labels include all of `want`.
fn points_sum(points: Option<&Vec<Point>>, want: &[(&str, &str)]) -> f64 {
    points
        .into_iter()
        .flatten()
        .filter(|p| {
            want.iter()
                .all(|(k, v)| p.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|p| p.value)
        .sum()
}

// ---------------------------------------------------------------------------------------------
// Broker
// ---------------------------------------------------------------------------------------------

/// Publishes `bodies` (confirmed, mandatory) to the commands exchange of the test's vhost.
async fn publish_commands(
    vhost: &TestVhost,
    routing_key: &str,
    bodies: &[Vec<u8>],
) -> anyhow::Result<()> {
    let messages: Vec<(BasicProperties, &[u8])> = bodies
        .iter()
        .enumerate()
        .map(|(i, body)| {
            let properties = BasicProperties::default()
                .with_delivery_mode(2)
                .with_message_id(format!("not-json-{i}").into())
                .with_content_type("text/plain".into());
            (properties, body.as_slice())
        })
        .collect();
    publish_confirmed(vhost, "commands", routing_key, &messages).await
}

// ---------------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_depth_alert_is_logged_once_each_way_and_never_touches_readiness()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let db = TestDb::create_empty().await?;
    let vhost = TestVhost::create().await?;
    let host = Host::start(
        &db,
        &vhost,
        HostConfig {
            sections: "[alerts]\ninterval = \"300ms\"\ndead_letter_depth = 2\n".into(),
            ..HostConfig::default()
        },
    )
    .await?;
    assert!(host.alerts().await?.is_empty(), "no alert at start");
    let host_ref = &host;

    // Five commands that never decode: email-send dead-letters them `malformed`, the
    // archiver takes them into the archive. Five waiting is over the threshold of two.
    let bodies: Vec<Vec<u8>> = (0..5)
        .map(|i| format!("not json {i}").into_bytes())
        .collect();
    publish_commands(&vhost, "email.send", &bodies).await?;
    let published_at = Instant::now();

    let alert = host
        .wait_for("the dead-letter-depth alert on /status", || async move {
            let alerts = host_ref.alerts().await?;
            Ok(alerts
                .into_iter()
                .find(|a| a["name"] == "dead-letter-depth:email.send"))
        })
        .await;
    eprintln!(
        "alert on /status {:?} after the publish",
        published_at.elapsed()
    );
    assert_eq!(alert["threshold"], 2.0, "{alert}");
    assert!(alert["value"].as_f64().unwrap_or_default() > 2.0, "{alert}");
    assert!(
        alert["message"]
            .as_str()
            .unwrap_or_default()
            .contains("email.send"),
        "{alert}"
    );
    assert_eq!(
        host.readyz().await?,
        200,
        "a dead-letter alert never makes the host unready"
    );

    // All five archived, and the alert says so once the readings catch up.
    let db_ref = &db;
    host.wait_for("the five dead letters archived", || async move {
        let archived: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM dead_letters WHERE queue = 'email.send' AND status = 'dead'",
        )
        .fetch_one(&db_ref.pool)
        .await?;
        Ok((archived == 5).then_some(()))
    })
    .await;
    let alert = host
        .wait_for("the alert's value at 5", || async move {
            let alerts = host_ref.alerts().await?;
            Ok(alerts
                .into_iter()
                .find(|a| a["name"] == "dead-letter-depth:email.send" && a["value"] == 5.0))
        })
        .await;
    assert!(
        alert["message"]
            .as_str()
            .unwrap_or_default()
            .contains("over by 3"),
        "{alert}"
    );
    assert_eq!(
        host.readyz().await?,
        200,
        "still ready while the alert lasts"
    );

    // An operator purges them: the depth falls to zero and the alert clears.
    let (code, stdout, stderr) = host
        .cli(&["dlq", "purge", "--queue", "email.send", "--yes"])
        .await?;
    assert_eq!(code, Some(0), "dlq purge: {stdout}\n{stderr}");
    assert!(stdout.contains("purged 5 dead letters"), "{stdout}");
    let purged_at = Instant::now();
    host.wait_for("the alert gone from /status", || async move {
        let alerts = host_ref.alerts().await?;
        Ok(alerts.is_empty().then_some(()))
    })
    .await;
    eprintln!("alert cleared {:?} after the purge", purged_at.elapsed());
    assert_eq!(host.readyz().await?, 200);

    // A few more readings: nothing more is logged about it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(host.alerts().await?.is_empty(), "the alert stays cleared");
    let lines = host.log_lines();
    let about_alerts: Vec<&serde_json::Value> =
        lines.iter().filter(|l| l["alert"].is_string()).collect();
    let message = |l: &serde_json::Value| l["message"].as_str().unwrap_or_default().to_string();
    let crossed: Vec<&&serde_json::Value> = about_alerts
        .iter()
        .filter(|l| l["level"] == "ERROR" && message(l).starts_with("alert:"))
        .collect();
    let cleared: Vec<&&serde_json::Value> = about_alerts
        .iter()
        .filter(|l| message(l).starts_with("alert cleared"))
        .collect();
    assert_eq!(
        crossed.len(),
        1,
        "one error line for the crossing: {about_alerts:#?}"
    );
    assert_eq!(
        cleared.len(),
        1,
        "one line for the clearing: {about_alerts:#?}"
    );
    assert_eq!(
        about_alerts.len(),
        2,
        "nothing else about alerts: {about_alerts:#?}"
    );
    assert_eq!(crossed[0]["alert"], "dead-letter-depth:email.send");
    assert_eq!(cleared[0]["alert"], "dead-letter-depth:email.send");
    assert_ne!(cleared[0]["level"], "ERROR", "{}", cleared[0]);
    let crossing = message(crossed[0]);
    assert!(
        crossing.contains("email.send") && crossing.contains("threshold 2"),
        "the line says what crossed and by how much: {crossing}"
    );

    host.stop_cleanly().await;
    eprintln!("test done in {:?}", started.elapsed());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_otlp_receiver_gets_the_same_metrics_as_the_metrics_endpoint() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let receiver = Receiver::start().await?;
    let db = TestDb::create_empty().await?;
    let vhost = TestVhost::create().await?;
    let host = Host::start(
        &db,
        &vhost,
        HostConfig {
            telemetry: format!(
                "otlp_endpoint = {:?}\nmetrics_interval = \"500ms\"\n",
                receiver.endpoint
            ),
            sections: "[jobs.db_health]\nschedule = \"every 1s\"\n".into(),
            ..HostConfig::default()
        },
    )
    .await?;

    // The timer jobs' ticks arrive over OTLP.
    let received = &receiver.received;
    let timer_jobs = ["outbox-drain", "db-health"];
    let ticks = host
        .wait_for(
            "worker_ticks_total for the timer jobs over OTLP",
            || async move {
                let latest = received.lock().unwrap().metrics.last().map(exported);
                Ok(latest.and_then(|m| {
                    let ticks = m.get("worker_ticks_total")?.clone();
                    timer_jobs
                        .iter()
                        .all(|job| {
                            points_sum(Some(&ticks), &[("job", job), ("outcome", "ran")]) >= 2.0
                        })
                        .then_some(ticks)
                }))
            },
        )
        .await;
    eprintln!("ticks over OTLP {:?} after start", started.elapsed());
    let otlp_jobs: BTreeSet<String> = ticks
        .iter()
        .filter_map(|p| p.labels.get("job").cloned())
        .collect();

    // /metrics shows the same counter for the same jobs.
    let scrape_started = unix_nanos();
    let scrape = host.metrics().await?;
    let scrape_ended = unix_nanos();
    let prom_jobs = scrape.label_values("worker_ticks_total", "job");
    for job in &otlp_jobs {
        assert!(
            prom_jobs.contains(job),
            "{job} is on OTLP, not on /metrics:\n{}",
            scrape.0
        );
    }
    // The process collector's `process_*` families are written by /metrics alone (they are
    // not OpenTelemetry instruments); every other family is the same on both.
    let families: BTreeSet<String> = scrape
        .families()
        .into_iter()
        .filter(|f| !f.starts_with("process_"))
        .collect();
    assert!(families.contains("worker_ticks_total"), "{}", scrape.0);

    // The same metrics: every family /metrics shows arrives over OTLP too, and the counts
    // agree — the export collected before the scrape counted no more than it, the one
    // collected after no less (by the points' collection times).
    let before = received
        .lock()
        .unwrap()
        .metrics
        .iter()
        .filter(|r| collected_at(r) < scrape_started)
        .max_by_key(|r| collected_at(r))
        .map(exported)
        .expect("an export collected before the scrape");
    let families_ref = &families;
    let after = host
        .wait_for("an OTLP export collected after the scrape", || async move {
            let received = received.lock().unwrap();
            Ok(received
                .metrics
                .iter()
                .find(|r| collected_at(r) > scrape_ended)
                .map(exported)
                .filter(|m| families_ref.iter().all(|f| m.contains_key(f))))
        })
        .await;
    let missing: Vec<&String> = families
        .iter()
        .filter(|f| !after.contains_key(*f))
        .collect();
    assert!(
        missing.is_empty(),
        "on /metrics, not over OTLP: {missing:?}"
    );
    for job in timer_jobs {
        let want = [("job", job), ("outcome", "ran")];
        let (b, p, a) = (
            points_sum(before.get("worker_ticks_total"), &want),
            scrape.sum("worker_ticks_total", &want),
            points_sum(after.get("worker_ticks_total"), &want),
        );
        assert!(
            b <= p && p <= a && p >= 2.0,
            "{job}: OTLP before {b}, /metrics {p}, OTLP after {a}"
        );
    }
    let duration_count = points_sum(
        after.get("worker_tick_duration_seconds"),
        &[("job", "db-health")],
    );
    assert!(
        duration_count >= 2.0,
        "the tick duration histogram: {duration_count}"
    );
    assert!(
        receiver.undecodable().is_empty(),
        "{:?}",
        receiver.undecodable()
    );

    host.stop_cleanly().await;
    eprintln!(
        "OTLP jobs {otlp_jobs:?}; families {families:?}; test done in {:?}",
        started.elapsed()
    );
    Ok(())
}

/// The spans of one trace, by span id.
struct Trace<'a> {
    spans: HashMap<Vec<u8>, &'a Span>,
}

impl<'a> Trace<'a> {
    fn new(spans: &'a [Span], trace_id: &[u8]) -> Self {
        Self {
            spans: spans
                .iter()
                .filter(|s| s.trace_id == trace_id)
                .map(|s| (s.span_id.clone(), s))
                .collect(),
        }
    }

    fn named(&self, name: &str) -> Vec<&'a Span> {
        self.spans
            .values()
            .filter(|s| s.name == name)
            .copied()
            .collect()
    }

    /// The one span called `name`.
    fn one(&self, name: &str) -> &'a Span {
        let found = self.named(name);
        assert_eq!(
            found.len(),
            1,
            "one span `{name}` in the trace; its spans: {}",
            self.describe()
        );
        found[0]
    }

    /// `span` and its ancestors, root first, following parent_span_id.
    fn path_to(&self, span: &'a Span) -> Vec<&'a Span> {
        let mut path = vec![span];
        let mut at = span;
        while !at.parent_span_id.is_empty() {
            let Some(parent) = self.spans.get(&at.parent_span_id) else {
                panic!(
                    "the parent of `{}` is not in the trace; its spans: {}",
                    at.name,
                    self.describe()
                );
            };
            path.push(parent);
            at = parent;
        }
        path.reverse();
        path
    }

    fn describe(&self) -> String {
        let mut names: Vec<String> = self
            .spans
            .values()
            .map(|s| {
                let parent = self
                    .spans
                    .get(&s.parent_span_id)
                    .map_or("-", |p| p.name.as_str());
                format!("{} (parent {parent})", s.name)
            })
            .collect();
        names.sort();
        names.join(", ")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_mail_through_the_loop_is_one_trace_from_the_poll_to_the_send() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let receiver = Receiver::start().await?;
    let db = TestDb::create_empty().await?;
    let vhost = TestVhost::create().await?;
    let id = short_id();
    let (account, sender) = (format!("trace-loop-{id}"), format!("trace-sender-{id}"));
    let host = Host::start(
        &db,
        &vhost,
        HostConfig {
            telemetry: format!("otlp_endpoint = {:?}\n", receiver.endpoint),
            mail_account: Some(account.clone()),
            ..HostConfig::default()
        },
    )
    .await?;

    let subject = format!("ping for the trace test {id}");
    let message_id = send_mail(
        &format!("{sender}@localhost"),
        &format!("{account}@localhost"),
        &subject,
        "operations.test",
    )
    .await?;
    let sent_at = Instant::now();
    let sender_ref = sender.as_str();
    host.wait_for("the reply in the sender's INBOX", || async move {
        Ok((inbox_count(sender_ref).await? >= 1).then_some(()))
    })
    .await;
    eprintln!("reply read {:?} after the mail", sent_at.elapsed());

    // The ids each hop carries (the drain deletes a published row and records it here).
    let outbox: Vec<(String, String)> =
        sqlx::query_as("SELECT routing_key, message_id FROM publications ORDER BY id")
            .fetch_all(&db.pool)
            .await?;
    let id_of = |key: &str| {
        outbox
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, id)| id.clone())
            .unwrap_or_else(|| panic!("no {key} outbox row: {outbox:?}"))
    };
    let (event_id, action_id, email_id) = (
        id_of("email.received"),
        id_of("automation.action"),
        id_of("email.send"),
    );

    // The host flushes its spans when it stops.
    host.stop_cleanly().await;
    let spans = receiver.spans();
    assert!(
        receiver.undecodable().is_empty(),
        "{:?}",
        receiver.undecodable()
    );

    // The poll of this mail starts the trace.
    let polls: Vec<&Span> = spans
        .iter()
        .filter(|s| {
            s.name.starts_with("poll ")
                && text_attribute(&s.attributes, "email.message_id").as_deref()
                    == Some(message_id.as_str())
        })
        .collect();
    let names: BTreeSet<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        polls.len(),
        1,
        "one poll span for the mail {message_id}; span names received: {names:?}"
    );
    let poll = polls[0];
    assert_eq!(poll.name, "poll loop");
    assert!(
        poll.parent_span_id.is_empty(),
        "the poll is the trace's root"
    );
    let trace = Trace::new(&spans, &poll.trace_id);

    // Every span of the mail's path, wherever it is, is in that one trace.
    let hops = [
        "outbox.publish email.received",
        "consume automation.trigger",
        "outbox.publish automation.action",
        "consume automation.action",
        "outbox.publish email.send",
        "consume email.send",
    ];
    for hop in hops {
        let everywhere: Vec<&Span> = spans.iter().filter(|s| s.name == hop).collect();
        assert_eq!(
            everywhere.len(),
            1,
            "one `{hop}` span was exported; span names received: {names:?}"
        );
        assert_eq!(
            everywhere[0].trace_id,
            poll.trace_id,
            "`{hop}` is in the mail's trace; the trace's spans: {}",
            trace.describe()
        );
    }

    // Each the child of the one before, from the poll to the SMTP send.
    let send = trace.one("email_send");
    let path: Vec<&str> = trace
        .path_to(send)
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(
        path,
        [
            "poll loop",
            "outbox.publish email.received",
            "consume automation.trigger",
            "automation_trigger",
            "outbox.publish automation.action",
            "consume automation.action",
            "automation_action",
            "outbox.publish email.send",
            "consume email.send",
            "email_send",
        ],
        "the trace's spans: {}",
        trace.describe()
    );

    // The ids, attempts and outcomes as attributes.
    let attr = |span: &Span, key: &str| text_attribute(&span.attributes, key);
    assert_eq!(attr(poll, "outcome").as_deref(), Some("stored"));
    for (publish, consume, id) in [
        (
            "outbox.publish email.received",
            "consume automation.trigger",
            &event_id,
        ),
        (
            "outbox.publish automation.action",
            "consume automation.action",
            &action_id,
        ),
        ("outbox.publish email.send", "consume email.send", &email_id),
    ] {
        let publish = trace.one(publish);
        assert_eq!(
            attr(publish, "messaging.message.id").as_ref(),
            Some(id),
            "{publish:?}"
        );
        assert_eq!(attr(publish, "outcome").as_deref(), Some("published"));
        let consume = trace.one(consume);
        assert_eq!(
            attr(consume, "messaging.message.id").as_ref(),
            Some(id),
            "{consume:?}"
        );
        assert_eq!(
            attr(consume, "attempt").as_deref(),
            Some("1"),
            "{consume:?}"
        );
        assert_eq!(
            attr(consume, "outcome").as_deref(),
            Some("succeeded"),
            "{consume:?}"
        );
    }

    eprintln!(
        "{} spans in the mail's trace, {} received in all; test done in {:?}",
        trace.spans.len(),
        spans.len(),
        started.elapsed()
    );
    Ok(())
}
