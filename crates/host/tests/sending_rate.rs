//! The SMTP account's sending rate on `/status` and on email-send's page, on the real binary:
//! the limits in force (`[smtp.rate]`), what the current windows hold and the time until the
//! next send. How the windows fill and the wait grows is email-send's own test (`tests/rate.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use support::SERIAL;
use support::console::{Operator, Setup, TOKEN, World};

fn with_a_rate() -> Setup {
    Setup {
        sections: "[smtp.rate]\nmessages_per_minute = 30\nrecipients_per_day = 10000\n".into(),
        ..Setup::with_token()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sending_rate_in_use_and_the_next_send_are_on_status_and_the_job_page()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start("WH_SHOW_SENDING_RATE_LOG", with_a_rate()).await?;

    let status = world.host.status().await?;
    let rate = &status["sending_rate"];
    assert_eq!(rate["limits"]["messages_per_minute"], 30, "{rate}");
    assert_eq!(rate["limits"]["recipients_per_day"], 10_000, "{rate}");
    assert!(rate["limits"]["messages_per_day"].is_null(), "{rate}");
    assert_eq!(rate["used"]["messages_this_minute"], 0, "{rate}");
    assert_eq!(
        rate["next_send_in_secs"], 0,
        "nothing sent: the next may go now"
    );
    assert_eq!(
        rate["account"],
        format!("127.0.0.1:{}/", world.sink.port),
        "{rate}"
    );

    let operator = Operator::sign_in(&world.host.url(""), TOKEN, "olga").await?;
    let page = operator.get("/jobs/email-send").await?.text().await?;
    assert!(
        page.contains("30 messages a minute, 10000 recipients a day for 127.0.0.1:"),
        "{page}"
    );
    assert!(page.contains("next send now"), "{page}");
    let other = operator.get("/jobs/draft-expiry").await?.text().await?;
    assert!(
        !other.contains("Sending rate"),
        "only email-send's page shows it"
    );
    world.host.stop_cleanly().await;
    Ok(())
}
