//! The SMTP account's sending rate on `/status`, on the real binary: the limits in force (the
//! settings' `[smtp.rate]`), what the current windows hold and the time until the next send.
//! How the windows fill and the wait grows is email-send's own test (`tests/rate.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use support::{Host, SERIAL, base_settings};
use worker_testkit::{TestDb, TestVhost};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sending_rate_in_use_and_the_next_send_are_on_status() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let db = TestDb::create().await?;
    let vhost = TestVhost::create().await?;
    let host = Host::launch("WH_SHOW_SENDING_RATE_LOG", |_, port| {
        Ok(format!(
            "{}\n[smtp.rate]\nmessages_per_minute = 30\nrecipients_per_day = 10000\n",
            base_settings("sending-rate", "[]", &db, &vhost, port)
        ))
    })
    .await?;

    let status = host.status().await?;
    let rate = &status["sending_rate"];
    assert_eq!(rate["limits"]["messages_per_minute"], 30, "{rate}");
    assert_eq!(rate["limits"]["recipients_per_day"], 10_000, "{rate}");
    assert!(rate["limits"]["messages_per_day"].is_null(), "{rate}");
    assert_eq!(rate["used"]["messages_this_minute"], 0, "{rate}");
    assert_eq!(rate["next_send_in_secs"], 0, "nothing sent: the next may go now");
    assert_eq!(rate["account"], "127.0.0.1:2525/", "{rate}");
    host.stop_cleanly().await;
    Ok(())
}
