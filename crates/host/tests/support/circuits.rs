//! An open circuit as the circuit tests make it: opened through the store, as a replica's own
//! failure opens it, with a cool-down long enough that no probe closes it during a test.

use std::time::Duration;

use worker_core::circuit::{CircuitSettings, Fault};
use worker_store::circuits::{Admission, Circuits};

use super::Host;

/// The SMTP relay's dependency, whose open circuit stops `email-send`.
pub const RELAY: &str = "smtp-relay";

/// Why it opened, in the relay's own words.
pub const REFUSED: &str = "535 5.7.8 Authentication credentials invalid";

/// Opens the relay's circuit in `pool`'s table as replica `test-replica`, next probe in an
/// hour.
pub async fn open_relay_circuit(pool: &sqlx::PgPool) -> anyhow::Result<()> {
    let hour = Duration::from_secs(3600);
    let settings = CircuitSettings {
        cool_down: hour,
        max_cool_down: hour,
        ..CircuitSettings::default()
    };
    let circuits = Circuits::new(pool.clone(), settings, "test-replica");
    let opened = circuits
        .failed(RELAY, Fault::AtOnce, REFUSED, &Admission::Go)
        .await;
    anyhow::ensure!(opened.is_some(), "the refused sign-in opens the circuit");
    Ok(())
}

/// The open circuits on `host`'s `/status`, once `wanted` of them are there.
pub async fn on_status(host: &Host, wanted: usize) -> Vec<serde_json::Value> {
    host.wait_for(&format!("{wanted} open circuits on /status"), || async {
        let status = host.status().await?;
        let open = status["circuits"].as_array().cloned().unwrap_or_default();
        Ok((open.len() == wanted).then_some(open))
    })
    .await
}
