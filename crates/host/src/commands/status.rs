//! `worker-host status`: asks the running host's admin endpoint and prints its answer, with
//! `admin.scrape_token` when the settings have one.

use crate::exit::Fatal;
use crate::settings::Settings;

pub async fn run(settings: &Settings) -> Result<(), Fatal> {
    let url = format!("{}/status", crate::admin::local_url(settings.admin.listen));
    let mut request = reqwest::Client::new().get(&url);
    if let Some(token) = &settings.admin.scrape_token {
        request = request.bearer_auth(token.expose());
    }
    let response = request
        .send()
        .await
        .map_err(|e| Fatal::unavailable(format!("no host answers at {url}: {e}")))?;
    if !response.status().is_success() {
        return Err(Fatal::unavailable(format!(
            "{url} answered {}{}",
            response.status(),
            if response.status() == reqwest::StatusCode::UNAUTHORIZED {
                ": set admin.scrape_token (or admin.scrape_token_file) in the settings this command reads"
            } else {
                ""
            }
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
