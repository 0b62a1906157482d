//! The operator's console over HTTP, on the real binary and the real services: every page and
//! its JSON, every action with its audit row, and the refusals (no session, a forged CSRF
//! token, a wrong password, a viewer's action, a page without a session). Who may sign in,
//! through what, and how fast is `console_access.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use reqwest::StatusCode;
use support::console::{Operator, Setup, TOKEN, World, http};
use support::{SERIAL, host_command, wait_for};

const PAGES: &[&str] = &[
    "/",
    "/dead-letters",
    "/dead-letters?status=all&search=no+such+user",
    "/dead-letters/messages",
    "/outbox",
    "/actions",
    "/jobs/draft-expiry",
    "/jobs/email-send",
    "/sign-in",
    "/api/overview",
    "/api/dead-letters",
    "/api/dead-letters/messages?queue=email.send",
    "/api/outbox",
    "/api/actions",
    "/api/jobs/draft-expiry",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_and_its_json_answer_with_the_security_headers() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::with_token("CONSOLE_SHOW_LOG").await?;
    let ids = world.dead_letters(1).await?;
    let one = format!("/dead-letters/{}", ids[0]);
    let api_one = format!("/api/dead-letters/{}", ids[0]);
    let http = http();
    for path in PAGES
        .iter()
        .copied()
        .chain([one.as_str(), api_one.as_str()])
    {
        let answer = http.get(world.host.url(path)).send().await?;
        let headers = answer.headers().clone();
        assert_eq!(
            answer.status(),
            StatusCode::OK,
            "{path}: {}",
            answer.text().await?
        );
        let csp = headers["content-security-policy"].to_str()?;
        assert!(
            csp.contains("default-src 'none'") && !csp.contains("unsafe-inline"),
            "{path}: {csp}"
        );
        assert_eq!(headers["cache-control"], "no-store", "{path}");
    }
    let page = http.get(world.host.url(&one)).send().await?.text().await?;
    assert!(
        page.contains("550 5.1.1 no such user"),
        "the error chain is shown"
    );
    assert!(page.contains("Attempt log"), "{page}");
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_id_or_job_is_404_and_a_bad_filter_400_naming_the_field() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::with_token("CONSOLE_SHOW_LOG").await?;
    let http = http();
    for (path, status, says) in [
        (
            "/dead-letters/999999",
            StatusCode::NOT_FOUND,
            "no dead letter has id 999999",
        ),
        (
            "/dead-letters/abc",
            StatusCode::NOT_FOUND,
            "not a dead letter",
        ),
        ("/jobs/no-such-job", StatusCode::NOT_FOUND, "no job called"),
        ("/actions/42", StatusCode::NOT_FOUND, "no recorded action"),
        (
            "/dead-letters?since=yesterday-ish",
            StatusCode::BAD_REQUEST,
            "since:",
        ),
        (
            "/dead-letters?since=300000y",
            StatusCode::BAD_REQUEST,
            "since:",
        ),
        (
            "/api/dead-letters?since=300000y",
            StatusCode::BAD_REQUEST,
            "since:",
        ),
        (
            "/dead-letters?status=gone",
            StatusCode::BAD_REQUEST,
            "status:",
        ),
        (
            "/dead-letters?fingerprint=xyz",
            StatusCode::BAD_REQUEST,
            "fingerprint",
        ),
        (
            "/dead-letters/messages?before=x",
            StatusCode::BAD_REQUEST,
            "before:",
        ),
        (
            "/api/dead-letters?until=soon",
            StatusCode::BAD_REQUEST,
            "until:",
        ),
    ] {
        let answer = http.get(world.host.url(path)).send().await?;
        assert_eq!(answer.status(), status, "{path}");
        let body = answer.text().await?;
        assert!(body.contains(says), "{path}: {body}");
    }
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_without_a_session_or_with_a_forged_csrf_token_is_refused_and_records_nothing()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::with_token("CONSOLE_SHOW_LOG").await?;
    let ids = world.dead_letters(1).await?;
    let id = ids[0].to_string();
    let anonymous = http();
    let answer = anonymous
        .post(world.host.url("/dead-letters/replay/run"))
        .form(&[("csrf", "anything"), ("id", id.as_str())])
        .send()
        .await?;
    assert_eq!(answer.status(), StatusCode::UNAUTHORIZED);

    let operator = Operator::sign_in(&world.host.url(""), TOKEN, "alice").await?;
    let forged = operator
        .http
        .post(world.host.url("/dead-letters/replay/run"))
        .header(reqwest::header::COOKIE, &operator.cookie)
        .form(&[("csrf", "forged"), ("id", id.as_str())])
        .send()
        .await?;
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    assert!(forged.text().await?.contains("CSRF"));
    let from_elsewhere = operator
        .http
        .post(world.host.url("/jobs/draft-expiry/pause"))
        .header(reqwest::header::COOKIE, &operator.cookie)
        .header("origin", "https://evil.example")
        .form(&[("csrf", operator.csrf.as_str())])
        .send()
        .await?;
    assert_eq!(from_elsewhere.status(), StatusCode::FORBIDDEN);

    assert!(world.trail().await?.is_empty(), "nothing was recorded");
    let status: String = sqlx::query_scalar("SELECT status FROM dead_letters WHERE id = $1")
        .bind(ids[0])
        .fetch_one(&world.db.pool)
        .await?;
    assert_eq!(status, "dead");
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_makes_no_session() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::with_token("CONSOLE_SHOW_LOG").await?;
    let refused = Operator::sign_in(&world.host.url(""), "not-the-token", "mallory").await;
    let why = refused.err().expect("refused").to_string();
    assert!(why.contains("401") && why.contains("wrong"), "{why}");
    let operator = Operator::sign_in(&world.host.url(""), TOKEN, "alice").await?;
    let page = operator.get("/").await?.text().await?;
    assert!(
        page.contains("signed in as <strong>bootstrap (alice)</strong>"),
        "the bootstrap account, with the name its operator gave: {page}"
    );
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_found_by_search_is_dry_run_then_replayed_delivered_and_recorded()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::with_token("CONSOLE_SHOW_LOG").await?;
    let ids = world.dead_letters(3).await?;
    let groups: serde_json::Value = http()
        .get(
            world
                .host
                .url("/api/dead-letters?search=no+such+user&queue=email.send"),
        )
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(groups["total"], 1, "{groups}");
    let group = &groups["groups"][0];
    assert_eq!(
        (group["count"].as_i64(), group["state"].as_str()),
        (Some(3), Some("dead"))
    );
    let fingerprint = group["fingerprint"].as_str().unwrap().to_string();

    let operator = Operator::sign_in(&world.host.url(""), TOKEN, "alice").await?;
    let filter = [
        ("queue", "email.send"),
        ("fingerprint", fingerprint.as_str()),
    ];
    let plan = operator.post("/dead-letters/replay", &filter).await?;
    assert_eq!(plan.status(), StatusCode::OK);
    let plan = plan.text().await?;
    assert!(plan.contains("id=\"planned\">3<"), "{plan}");
    assert_eq!(world.delivered_to_refused(), 0, "a dry run sends nothing");

    world.sink.accept_recipient(&world.refused)?;
    let mut run = filter.to_vec();
    run.extend([("planned", "3"), ("rate", "100")]);
    let progress = operator
        .post_redirected("/dead-letters/replay/run", &run)
        .await?;
    assert!(progress.starts_with("/actions/"), "{progress}");

    wait_for(
        "the replayed replies delivered",
        || world.host.log_tail(),
        || async { Ok((world.delivered_to_refused() >= 3).then_some(())) },
    )
    .await;
    let page = operator.finished(&world.host, &progress).await;
    assert!(page.contains("<strong>3</strong> done"), "{page}");

    let after: serde_json::Value = http()
        .get(world.host.url(&format!(
            "/api/dead-letters?status=all&fingerprint={fingerprint}"
        )))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(after["groups"][0]["state"], "replayed", "{after}");
    let one = operator
        .get(&format!("/dead-letters/{}", ids[0]))
        .await?
        .text()
        .await?;
    assert!(one.contains("Replayed by <strong>alice</strong>"), "{one}");
    assert_eq!(
        world.trail().await?,
        vec![
            ("replay".into(), Some("alice".into()), true, None, 0),
            ("replay".into(), Some("alice".into()), false, Some(3), 3),
        ]
    );
    assert_eq!(world.delivered_to_refused(), 3, "each once");
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_group_is_marked_purged_and_recorded() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::with_token("CONSOLE_SHOW_LOG").await?;
    world.dead_letters(2).await?;
    let operator = Operator::sign_in(&world.host.url(""), TOKEN, "bob").await?;
    let plan = operator
        .post("/dead-letters/purge", &[("queue", "email.send")])
        .await?
        .text()
        .await?;
    assert!(plan.contains("id=\"planned\">2<"), "{plan}");
    let progress = operator
        .post_redirected(
            "/dead-letters/purge/run",
            &[("queue", "email.send"), ("planned", "2")],
        )
        .await?;
    operator.finished(&world.host, &progress).await;
    let states: Vec<String> = sqlx::query_scalar("SELECT DISTINCT status FROM dead_letters")
        .fetch_all(&world.db.pool)
        .await?;
    assert_eq!(states, vec!["purged".to_string()]);
    assert_eq!(
        world.trail().await?,
        vec![
            ("purge".into(), Some("bob".into()), true, None, 0),
            ("purge".into(), Some("bob".into()), false, Some(2), 2),
        ]
    );
    assert_eq!(world.delivered_to_refused(), 0, "a purge sends nothing");
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paced_replay_is_cancelled_from_its_page_and_leaves_the_rest_dead() -> anyhow::Result<()>
{
    let _serial = SERIAL.lock().await;
    let world = World::with_token("CONSOLE_SHOW_LOG").await?;
    world.dead_letters(6).await?;
    let operator = Operator::sign_in(&world.host.url(""), TOKEN, "carol").await?;
    let progress = operator
        .post_redirected(
            "/dead-letters/replay/run",
            &[("queue", "email.send"), ("planned", "6"), ("rate", "1")],
        )
        .await?;
    let page = operator.get(&progress).await?.text().await?;
    assert!(
        page.contains("http-equiv=\"refresh\""),
        "a running action's page reloads itself"
    );
    let cancel = format!("{progress}/cancel");
    assert_eq!(operator.post_redirected(&cancel, &[]).await?, progress);
    let page = operator.finished(&world.host, &progress).await;
    assert!(
        page.contains("stopped: cancelled by bootstrap (carol, console from"),
        "{page}"
    );
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM dead_letters WHERE status = 'dead'")
        .fetch_one(&world.db.pool)
        .await?;
    assert!(
        dead >= 4,
        "at one a second, most were not reached: {dead} still dead"
    );
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_is_paused_for_every_replica_run_now_and_resumed_each_recorded()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start(
        "CONSOLE_SHOW_LOG",
        Setup {
            sections: "[jobs.draft_expiry]\nschedule = \"every 1s\"\n".into(),
            ..Setup::with_token()
        },
    )
    .await?;
    let operator = Operator::sign_in(&world.host.url(""), TOKEN, "dave").await?;
    operator
        .post_redirected("/jobs/draft-expiry/pause", &[])
        .await?;
    let paused: Vec<String> = sqlx::query_scalar("SELECT job FROM job_pauses")
        .fetch_all(&world.db.pool)
        .await?;
    assert_eq!(
        paused,
        vec!["draft-expiry".to_string()],
        "in the database, for every replica"
    );
    let host = &world.host;
    host.wait_for("ticks skipped while paused", || async {
        Ok((host.count("draft-expiry", "skipped_paused").await? >= 2).then_some(()))
    })
    .await;
    let ran = host.count("draft-expiry", "ran").await?;
    operator
        .post_redirected("/jobs/draft-expiry/run-now", &[])
        .await?;
    host.wait_for("the tick run now", || async {
        Ok((host.count("draft-expiry", "ran").await? > ran).then_some(()))
    })
    .await;
    operator
        .post_redirected("/jobs/draft-expiry/resume", &[])
        .await?;
    let refused = operator.post("/jobs/db-health/pause", &[]).await?;
    assert_eq!(
        refused.status(),
        StatusCode::CONFLICT,
        "the probe drives readiness"
    );

    let page = operator.get("/jobs/draft-expiry").await?.text().await?;
    assert!(
        page.contains("id=\"pause\""),
        "resumed: the page offers to pause again"
    );
    let trail: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT action, filter ->> 'job', actor FROM dead_letter_actions ORDER BY id",
    )
    .fetch_all(&world.db.pool)
    .await?;
    let dave = Some("dave".to_string());
    assert_eq!(
        trail,
        vec![
            ("pause".into(), "draft-expiry".into(), dave.clone()),
            ("trigger".into(), "draft-expiry".into(), dave.clone()),
            ("resume".into(), "draft-expiry".into(), dave),
        ]
    );
    world.host.stop_cleanly().await;
    Ok(())
}

/// A timer runs now by its route, `run-now`, and by the route's name before, `trigger`, which
/// operators' scripts still post to, from a page and through the API; each run is recorded
/// as `trigger` (the stored word) and shown as "run now".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_runs_now_by_its_route_and_by_its_former_trigger_route() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start("CONSOLE_SHOW_LOG", Setup::with_token()).await?;
    let operator = Operator::sign_in(&world.host.url(""), TOKEN, "dave").await?;
    let http = http();
    let host = &world.host;
    for route in ["run-now", "trigger"] {
        let ran = host.count("draft-expiry", "ran").await?;
        let page = format!("/jobs/draft-expiry/{route}");
        assert_eq!(
            operator.post_redirected(&page, &[]).await?,
            "/jobs/draft-expiry"
        );
        host.wait_for("the tick run from the page", || async {
            Ok((host.count("draft-expiry", "ran").await? > ran).then_some(()))
        })
        .await;
        let ran = host.count("draft-expiry", "ran").await?;
        let api = format!("/api/jobs/draft-expiry/{route}");
        let answer = http
            .post(host.url(&api))
            .bearer_auth(TOKEN)
            .form(&[("unused", "")])
            .send()
            .await?;
        assert_eq!(answer.status(), StatusCode::OK, "{api}");
        let body: serde_json::Value = answer.json().await?;
        assert_eq!(body["location"], "/jobs/draft-expiry", "{api}");
        host.wait_for("the tick run through the API", || async {
            Ok((host.count("draft-expiry", "ran").await? > ran).then_some(()))
        })
        .await;
    }
    let kinds: Vec<String> = world.trail().await?.into_iter().map(|row| row.0).collect();
    assert_eq!(
        kinds, ["trigger"; 4],
        "stored under the word rows already use"
    );
    let trail = operator.get("/actions").await?.text().await?;
    assert!(trail.contains("Operator actions"), "{trail}");
    assert!(trail.contains("<td>run now"), "{trail}");
    let page = operator.get("/jobs/draft-expiry").await?.text().await?;
    assert!(page.contains("/jobs/draft-expiry/run-now"), "{page}");
    assert!(page.contains("<td>run now</td>"), "{page}");
    world.host.stop_cleanly().await;
    Ok(())
}

/// `dead-letter-archive`'s tick was `dead-letter-maintenance` in the release before: a pause an
/// operator made there, during a rolling upgrade, holds the job here too, resuming it under its
/// new name removes that pause, and the ticks recorded under the old name show on its page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_and_ticks_under_a_jobs_former_name_are_its_own() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start(
        "CONSOLE_SHOW_LOG",
        Setup {
            sections: "[jobs.dead_letter_archive]\nschedule = \"every 1s\"\n".into(),
            ..Setup::with_token()
        },
    )
    .await?;
    let former =
        worker_core::JobSpec::timer("dead-letter-maintenance", worker_core::Lease::OneReplica);
    let actor = worker_store::audit::Actor::new("erin", "an-older-release");
    worker_store::pauses::pause(&world.db.pool, &former, &actor, None).await?;
    let host = &world.host;
    host.wait_for("ticks skipped while paused", || async {
        Ok((host.count("dead-letter-archive", "skipped_paused").await? >= 2).then_some(()))
    })
    .await;
    // A tick the older release recorded under the old name.
    sqlx::query(
        "INSERT INTO attempt_log (job, tick, attempt, try_number, outcome, is_final, duration_ms, error, at) \
         VALUES ('dead-letter-maintenance', 1, 1, 1, 'failed', true, 3.5, 'a tick of the older release', now())",
    )
    .execute(&world.db.pool)
    .await?;
    let operator = Operator::sign_in(&world.host.url(""), TOKEN, "dave").await?;
    let page = operator
        .get("/jobs/dead-letter-archive")
        .await?
        .text()
        .await?;
    assert!(page.contains("id=\"resume\""), "shown paused: {page}");
    assert!(
        page.contains("a tick of the older release"),
        "its ticks under the former name are on its page: {page}"
    );
    operator
        .post_redirected("/jobs/dead-letter-archive/resume", &[])
        .await?;
    let paused: Vec<String> = sqlx::query_scalar("SELECT job FROM job_pauses")
        .fetch_all(&world.db.pool)
        .await?;
    assert!(
        paused.is_empty(),
        "the former name's pause is gone: {paused:?}"
    );
    let refused = operator
        .post("/jobs/dead-letter-maintenance/pause", &[])
        .await?;
    assert_eq!(
        refused.status(),
        StatusCode::NOT_FOUND,
        "the console's pages are under the job's one name"
    );
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_outbox_row_is_retried_from_the_page_and_recorded() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::with_token("CONSOLE_SHOW_LOG").await?;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO outbox (message_id, exchange, routing_key, body, status, attempts, last_error) \
         VALUES ('m-console', 'events', 'nothing.bound', '{}', 'failed', 8, 'unroutable') RETURNING id",
    )
    .fetch_one(&world.db.pool)
    .await?;
    let page = http()
        .get(world.host.url("/outbox"))
        .send()
        .await?
        .text()
        .await?;
    assert!(
        page.contains("m-console") && page.contains("unroutable"),
        "{page}"
    );
    let operator = Operator::sign_in(&world.host.url(""), TOKEN, "erin").await?;
    let id_text = id.to_string();
    operator
        .post_redirected("/outbox/retry", &[("id", id_text.as_str())])
        .await?;
    let retries: i32 = sqlx::query_scalar("SELECT retries FROM outbox WHERE id = $1")
        .bind(id)
        .fetch_one(&world.db.pool)
        .await?;
    assert_eq!(retries, 1, "put back to pending once");
    let trail: Vec<(String, Option<i64>, Option<String>)> = sqlx::query_as(
        "SELECT action, (filter ->> 'outbox_id')::bigint, actor FROM dead_letter_actions",
    )
    .fetch_all(&world.db.pool)
    .await?;
    assert_eq!(
        trail,
        vec![("outbox-retry".into(), Some(id), Some("erin".into()))]
    );
    world.host.stop_cleanly().await;
    Ok(())
}

/// `count` failed outbox rows that nothing drains (no queue is bound to their routing key).
async fn failed_outbox_rows(world: &World, prefix: &str, count: usize) -> anyhow::Result<()> {
    for i in 0..count {
        sqlx::query(
            "INSERT INTO outbox (message_id, exchange, routing_key, body, status, attempts, last_error) \
             VALUES ($1, 'events', 'nothing.bound', '{}', 'failed', 8, 'unroutable')",
        )
        .bind(format!("{prefix}-{i}"))
        .execute(&world.db.pool)
        .await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrying_every_failed_outbox_row_is_dry_run_first_and_keeps_to_the_confirmed_count()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::with_token("CONSOLE_SHOW_LOG").await?;
    failed_outbox_rows(&world, "early", 3).await?;
    let operator = Operator::sign_in(&world.host.url(""), TOKEN, "erin").await?;
    let plan = operator.post("/outbox/retry", &[("all", "failed")]).await?;
    assert_eq!(
        plan.status(),
        StatusCode::OK,
        "a page to confirm, not a redirect"
    );
    let page = plan.text().await?;
    assert!(page.contains("id=\"planned\">3<"), "{page}");
    let retried = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox WHERE retries > 0")
            .fetch_one(&world.db.pool)
            .await
            .unwrap()
    };
    assert_eq!(retried().await, 0, "the dry run put nothing back");

    failed_outbox_rows(&world, "late", 2).await?;
    operator
        .post_redirected(
            "/outbox/retry",
            &[("all", "failed"), ("confirm", "yes"), ("planned", "3")],
        )
        .await?;
    assert_eq!(retried().await, 3, "no more than the operator confirmed");
    let late_failed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox WHERE message_id LIKE 'late-%' AND retries = 0",
    )
    .fetch_one(&world.db.pool)
    .await?;
    assert_eq!(
        late_failed, 2,
        "the rows that failed after the dry run wait"
    );
    let trail: Vec<(String, bool, Option<i64>)> =
        sqlx::query_as("SELECT action, dry_run, planned FROM dead_letter_actions ORDER BY id")
            .fetch_all(&world.db.pool)
            .await?;
    assert_eq!(
        trail,
        vec![
            ("outbox-retry".into(), true, None),
            ("outbox-retry".into(), false, Some(3)),
        ]
    );
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_reads_every_page_but_every_action_is_refused_and_records_nothing()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start("CONSOLE_SHOW_LOG", Setup::signed_reading()).await?;
    let ids = world.dead_letters(1).await?;
    world.add_account("vera", "viewer", "vera-password-long")?;
    let viewer = Operator::sign_in(&world.host.url(""), "vera-password-long", "vera").await?;
    for path in PAGES {
        assert_eq!(viewer.get(path).await?.status(), StatusCode::OK, "{path}");
    }
    let page = viewer
        .get(&format!("/dead-letters/{}", ids[0]))
        .await?
        .text()
        .await?;
    assert!(
        !page.contains("class=\"replay\""),
        "no replay button: {page}"
    );
    let id = ids[0].to_string();
    for (path, fields) in [
        ("/jobs/draft-expiry/pause", vec![]),
        ("/jobs/draft-expiry/run-now", vec![]),
        ("/jobs/draft-expiry/trigger", vec![]),
        ("/dead-letters/replay", vec![("id", id.as_str())]),
        ("/outbox/retry", vec![("all", "failed")]),
    ] {
        let answer = viewer.post(path, &fields).await?;
        assert_eq!(answer.status(), StatusCode::FORBIDDEN, "{path}");
        let body = answer.text().await?;
        assert!(body.contains("viewer"), "{path}: {body}");
    }
    let trail = world.trail().await?;
    let actions: Vec<&str> = trail.iter().map(|row| row.0.as_str()).collect();
    assert_eq!(actions, ["operator-add"], "only the account was recorded");
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_loopback_every_page_needs_a_session_and_the_api_the_token() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start(
        "CONSOLE_SHOW_LOG",
        Setup {
            everywhere: true,
            ..Setup::signed_reading()
        },
    )
    .await?;
    let http = http();
    let page = http.get(world.host.url("/dead-letters")).send().await?;
    assert_eq!(page.status(), StatusCode::SEE_OTHER);
    assert_eq!(page.headers()["location"], "/sign-in?next=%2Fdead-letters");
    let api = http.get(world.host.url("/api/overview")).send().await?;
    assert_eq!(api.status(), StatusCode::UNAUTHORIZED);
    let bearer = http
        .get(world.host.url("/api/overview"))
        .bearer_auth(TOKEN)
        .send()
        .await?;
    assert_eq!(bearer.status(), StatusCode::OK);
    let operator = Operator::sign_in(&world.host.url(""), TOKEN, "frank").await?;
    assert_eq!(
        operator.get("/dead-letters").await?.status(),
        StatusCode::OK
    );
    assert_eq!(
        http.get(world.host.url("/readyz")).send().await?.status(),
        StatusCode::OK,
        "probes stay open"
    );
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test]
async fn open_reading_off_loopback_is_refused_at_start() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("worker-host.toml");
    std::fs::write(
        &config,
        "[admin]\nlisten = \"0.0.0.0:9180\"\nopen_reading = true\n",
    )?;
    let output = host_command(&config).args(["config", "check"]).output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("admin.open_reading") && stderr.contains("loopback"),
        "{stderr}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replays_plan_says_how_many_replies_would_expire() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::with_token("CONSOLE_SHOW_LOG").await?;
    world.dead_letters(2).await?;
    // One of the two refused replies is past its own age limit (an automation's max_age).
    sqlx::query(
        "UPDATE outbound_emails SET expires_at = now() - interval '1 minute' \
         WHERE id = (SELECT min(id::text)::uuid FROM outbound_emails)",
    )
    .execute(&world.db.pool)
    .await?;
    let operator = Operator::sign_in(&world.host.url(""), TOKEN, "alice").await?;
    let plan = operator
        .post("/dead-letters/replay", &[("queue", "email.send")])
        .await?;
    assert_eq!(plan.status(), StatusCode::OK);
    let plan = plan.text().await?;
    assert!(plan.contains("id=\"planned\">2<"), "{plan}");
    assert!(
        plan.contains(
            "id=\"would-expire\"><strong>1</strong> of them is a reply past its age limit"
        ),
        "{plan}"
    );
    world.host.stop_cleanly().await;
    Ok(())
}
