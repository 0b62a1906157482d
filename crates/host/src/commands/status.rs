//! `worker-host status`: asks the running host's admin endpoint and prints its answer.

use crate::exit::Fatal;
use crate::settings::Settings;

pub async fn run(settings: &Settings) -> Result<(), Fatal> {
    let url = format!("{}/status", crate::admin::local_url(settings.admin.listen));
    let response = reqwest::get(&url)
        .await
        .map_err(|e| Fatal::unavailable(format!("no host answers at {url}: {e}")))?;
    if !response.status().is_success() {
        return Err(Fatal::unavailable(format!(
            "{url} answered {}",
            response.status()
        )));
    }
    let body: serde_json::Value = response
        .json()
        .await
        .map_err(|e| Fatal::software(format!("{url}: {e}")))?;
    println!(
        "{}",
        serde_json::to_string_pretty(&body).unwrap_or_default()
    );
    Ok(())
}
