//! `worker-host queues send-now` with the real binary on a real broker and database (issue
//! 39): the dry run counts what waits in the retry tiers and moves nothing; the confirmed run
//! moves at most the planned count back to the work queue, each message keeping its attempt
//! count; both are audit entries with who and why.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use lapin::BasicProperties;
use lapin::options::{BasicAckOptions, BasicGetOptions, BasicPublishOptions};
use lapin::types::{AMQPValue, FieldTable};
use support::{Installation, host_command};

fn send_now(config: &std::path::Path, args: &[&str]) -> (i32, String) {
    let output = host_command(config)
        .args(["queues", "send-now", "--queue", "email.send"])
        .args(args)
        .env_remove("WORKER_HOST_ACTOR")
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

/// Parks one message in `tier` as the consumer does: through the default exchange, its next
/// attempt in `x-attempt`.
async fn park(channel: &lapin::Channel, tier: &str, id: &str, attempt: i64) -> anyhow::Result<()> {
    let mut headers = FieldTable::default();
    headers.insert("x-attempt".into(), AMQPValue::LongLongInt(attempt));
    let properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(id.into())
        .with_headers(headers);
    let confirm = channel
        .basic_publish(
            "".into(),
            tier.into(),
            BasicPublishOptions {
                mandatory: true,
                immediate: false,
            },
            id.as_bytes(),
            properties,
        )
        .await?
        .await?;
    assert!(confirm.take_message().is_none(), "{tier} exists");
    Ok(())
}

async fn ready(channel: &lapin::Channel, queue: &str) -> u32 {
    worker_testkit::amqp::counts(channel, queue)
        .await
        .unwrap()
        .0
}

#[tokio::test]
async fn send_now_dry_runs_then_moves_the_planned_count_with_attempts_kept_and_audited()
-> anyhow::Result<()> {
    let installation = Installation::new("send-now-test").await?;
    installation.declare_topology();
    let connection = worker_testkit::amqp::connect(&installation.vhost).await?;
    let channel = connection.create_channel().await?;
    channel.confirm_select(Default::default()).await?;
    // Tiers long enough that nothing expires into the work queue during the test.
    for id in ["a", "b", "c"] {
        park(&channel, "email.send.retry.2m", id, 4).await?;
    }
    park(&channel, "email.send.retry.10m", "d", 5).await?;

    let (code, out) = send_now(
        &installation.config,
        &["--actor", "alice", "--reason", "relay fixed"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("4 wait in the retry tiers"), "{out}");
    assert!(out.contains("--planned 4"), "{out}");
    assert_eq!(
        ready(&channel, "email.send").await,
        0,
        "the dry run moved nothing"
    );
    assert_eq!(ready(&channel, "email.send.retry.2m").await, 3);

    let (code, out) = send_now(
        &installation.config,
        &[
            "--planned",
            "2",
            "--actor",
            "alice",
            "--reason",
            "relay fixed",
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("moved 2 of 4"), "{out}");
    assert_eq!(ready(&channel, "email.send").await, 2, "the cap held");
    assert_eq!(ready(&channel, "email.send.retry.2m").await, 1);
    assert_eq!(ready(&channel, "email.send.retry.10m").await, 1);
    for _ in 0..2 {
        let got = channel
            .basic_get("email.send".into(), BasicGetOptions { no_ack: false })
            .await?
            .expect("a moved message");
        let attempt = got
            .delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("x-attempt").cloned());
        assert_eq!(attempt, Some(AMQPValue::LongLongInt(4)), "attempt kept");
        channel
            .basic_ack(got.delivery.delivery_tag, BasicAckOptions::default())
            .await?;
    }

    type Row = (
        String,
        bool,
        Option<String>,
        serde_json::Value,
        Option<i64>,
        i64,
        i64,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT action, dry_run, actor, filter, planned, matched, succeeded \
         FROM dead_letter_actions ORDER BY id",
    )
    .fetch_all(&installation.db.pool)
    .await?;
    let target = serde_json::json!({"queue": "email.send", "reason": "relay fixed"});
    assert_eq!(
        rows,
        vec![
            (
                "send-now".into(),
                true,
                Some("alice".into()),
                target.clone(),
                None,
                4,
                0
            ),
            (
                "send-now".into(),
                false,
                Some("alice".into()),
                target,
                Some(2),
                2,
                2
            ),
        ]
    );
    Ok(())
}

/// The queue page's button through its `/api/` twin: the dry run answers the count and moves
/// nothing; the run with that count moves at most it, and both are in the audit trail with
/// the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_api_dry_runs_then_sends_the_confirmed_count() -> anyhow::Result<()> {
    use support::console::{Operator, TOKEN, World, http};
    let world = World::with_token("SEND_NOW_LOG").await?;
    let host = &world.host;
    let connection = worker_testkit::amqp::connect(&world.vhost).await?;
    let channel = connection.create_channel().await?;
    channel.confirm_select(Default::default()).await?;
    for id in ["a", "b", "c"] {
        park(&channel, "email.send.retry.2m", id, 4).await?;
    }
    let http = http();
    // The console knows the queue's tiers once its sampler has read them.
    host.wait_for("the queue's tiers sampled", || async {
        let page = http
            .get(host.url("/api/queues/email.send"))
            .bearer_auth(TOKEN)
            .send()
            .await?;
        Ok(page.status().is_success().then_some(()))
    })
    .await;

    let post = |path: &'static str, form: Vec<(&'static str, &'static str)>| {
        let http = http.clone();
        let url = host.url(path);
        async move {
            let answer = http.post(url).bearer_auth(TOKEN).form(&form).send().await?;
            assert!(answer.status().is_success(), "{path}: {}", answer.status());
            anyhow::Ok(answer.json::<serde_json::Value>().await?)
        }
    };
    let dry = post(
        "/api/queues/email.send/send-now",
        vec![("reason", "relay fixed")],
    )
    .await?;
    assert_eq!(dry["dry_run"], true, "{dry}");
    assert_eq!(dry["waiting"], 3, "{dry}");
    assert_eq!(dry["moved"], 0, "{dry}");
    assert_eq!(
        ready(&channel, "email.send.retry.2m").await,
        3,
        "moved nothing"
    );

    let refused = http
        .post(host.url("/api/queues/email.send/send-now/run"))
        .bearer_auth(TOKEN)
        .form(&[("reason", "relay fixed")])
        .send()
        .await?;
    assert_eq!(refused.status(), 400, "a run needs the confirmed count");

    let run = post(
        "/api/queues/email.send/send-now/run",
        vec![("planned", "2"), ("reason", "relay fixed")],
    )
    .await?;
    assert_eq!(run["moved"], 2, "{run}");
    assert_eq!(run["beyond_planned"], 1, "{run}");
    assert_eq!(
        ready(&channel, "email.send.retry.2m").await,
        1,
        "the cap held"
    );

    // The page: the button, the confirm page with the count, then the action's page.
    let operator = Operator::sign_in(&host.url(""), TOKEN, "alice").await?;
    let page = operator.get("/queues/email.send").await?.text().await?;
    assert!(page.contains("/queues/email.send/send-now"), "{page}");
    let confirm = operator
        .post("/queues/email.send/send-now", &[("reason", "relay fixed")])
        .await?
        .text()
        .await?;
    assert!(confirm.contains(r#"name="planned" value="1""#), "{confirm}");
    let sent = operator
        .post(
            "/queues/email.send/send-now/run",
            &[("planned", "1"), ("reason", "relay fixed")],
        )
        .await?;
    assert_eq!(sent.status(), 303);
    assert_eq!(ready(&channel, "email.send.retry.2m").await, 0);

    type ApiRow = (
        String,
        bool,
        serde_json::Value,
        Option<i64>,
        i64,
        Option<String>,
    );
    let rows: Vec<ApiRow> = sqlx::query_as(
        "SELECT action, dry_run, filter, planned, succeeded, via \
             FROM dead_letter_actions WHERE action = 'send-now' ORDER BY id LIMIT 2",
    )
    .fetch_all(&world.db.pool)
    .await?;
    let target = serde_json::json!({"queue": "email.send", "reason": "relay fixed"});
    assert_eq!(
        rows,
        vec![
            (
                "send-now".into(),
                true,
                target.clone(),
                None,
                0,
                Some("api".into())
            ),
            (
                "send-now".into(),
                false,
                target,
                Some(2),
                2,
                Some("api".into())
            ),
        ]
    );
    world.host.stop_cleanly().await;
    Ok(())
}

/// The story the issue tells: the relay refuses a reply for a while, so it is parked in a
/// long tier; once the relay takes mail again, send-now delivers it at once instead of after
/// the tier's ten minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_parked_while_the_relay_refused_it_is_delivered_once_sent_now() -> anyhow::Result<()>
{
    use support::console::{Setup, TOKEN, World, http};
    let setup = Setup {
        sections: "[jobs.email_send.queue]\nretry_tiers = [\"10m\"]\n".into(),
        ..Setup::with_token()
    };
    let world = World::start("SEND_NOW_LOG", setup).await?;
    let host = &world.host;
    let local = format!("parked-{}", uuid::Uuid::new_v4().simple());
    let address = format!("{local}@localhost");
    world
        .sink
        .fail_recipient(&address, "451 4.3.0 try again later")?;
    support::publish_pings(&world.vhost, &address, 1).await?;
    let connection = worker_testkit::amqp::connect(&world.vhost).await?;
    let channel = connection.create_channel().await?;
    host.wait_for("the reply parked in the 10m tier", || async {
        Ok((ready(&channel, "email.send.retry.10m").await == 1).then_some(()))
    })
    .await;
    world.sink.accept_recipient(&address)?;

    let http = http();
    for (path, form) in [
        (
            "/api/queues/email.send/send-now",
            vec![("reason", "relay back")],
        ),
        (
            "/api/queues/email.send/send-now/run",
            vec![("planned", "1"), ("reason", "relay back")],
        ),
    ] {
        let answer = http
            .post(host.url(path))
            .bearer_auth(TOKEN)
            .form(&form)
            .send()
            .await?;
        assert!(answer.status().is_success(), "{path}: {}", answer.status());
    }
    host.wait_for("the reply delivered", || async {
        Ok((!world.sink.delivered(&local).is_empty()).then_some(()))
    })
    .await;
    assert_eq!(ready(&channel, "email.send.retry.10m").await, 0);
    world.host.stop_cleanly().await;
    Ok(())
}
