//! A command's own broker connection: opened with the settings' bounded retries, handed to
//! the command's work, and closed (waiting at most 5 s) whatever the work returned.

use std::future::Future;
use std::time::Duration;

use worker_broker::{Publisher, Session};

use crate::connections;
use crate::exit::Fatal;
use crate::settings::Settings;

/// Runs `work` on a connection of its own, closed afterwards with `why`.
pub async fn with_session<F, Fut, T>(settings: &Settings, why: &str, work: F) -> Result<T, Fatal>
where
    F: FnOnce(Session) -> Fut,
    Fut: Future<Output = T>,
{
    let session = connections::connect_broker(
        &connections::broker_connection(settings).map_err(Fatal::usage)?,
        settings.broker.connect_attempts,
    )
    .await
    .map_err(Fatal::unavailable)?;
    let result = work(session.clone()).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), session.close(why)).await;
    Ok(result)
}

/// A confirmed publisher on `session` alone (never another connection).
pub fn publisher_on(settings: &Settings, session: &Session) -> Publisher {
    Publisher::new(session.clone().fixed(), settings.broker.publisher.clone())
}
