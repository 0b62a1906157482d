//! `worker-host health`: whether the running host is ready, asked of its own `/readyz`. For a
//! container's `HEALTHCHECK`, which has no curl: exit 0 when ready, 1 when not or when nothing
//! answers, as health checks expect.

use std::time::Duration;

use crate::admin::local_url;
use crate::exit::{self, Fatal};
use crate::readiness::ReadinessReport;
use crate::settings::Settings;

/// How long the host may take to answer; a container's health check gives about this much.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

pub async fn run(settings: &Settings) -> Result<(), Fatal> {
    if !settings.admin.enabled {
        return Err(Fatal::usage(
            "admin.enabled = false: the host serves no /readyz to ask",
        ));
    }
    let url = format!("{}/readyz", local_url(settings.admin.listen));
    let unhealthy = |message: String| Fatal {
        code: exit::UNHEALTHY,
        message,
    };
    let client = reqwest::Client::builder()
        .timeout(ANSWER_WITHIN)
        .build()
        .map_err(|e| Fatal::software(format!("the HTTP client cannot start: {e}")))?;
    let response = client
        .get(&url)
        .send()
        .await
        .map_err(|e| unhealthy(format!("not healthy: no host answers at {url}: {e}")))?;
    let status = response.status();
    let report: ReadinessReport = response.json().await.unwrap_or_default();
    if status.is_success() {
        println!("ready");
        return Ok(());
    }
    let down = report.failures();
    Err(unhealthy(if down.is_empty() {
        format!("not ready: {url} answered {status}")
    } else {
        format!("not ready: {down}")
    }))
}
