//! Waits on a page in a real browser (fantoccini), for the console's browser tests: each
//! waits up to a minute, since a page may be loading or reloading itself, and fails with the
//! page's source.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use fantoccini::{Client, Locator};

/// Waits up to a minute for `css` to be on the page (which may be reloading itself).
pub async fn element(client: &Client, css: &str) -> fantoccini::elements::Element {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match client.find(Locator::Css(css)).await {
            Ok(found) => return found,
            Err(e) if Instant::now() > deadline => {
                let source = client.source().await.unwrap_or_default();
                panic!("no `{css}` on the page: {e}\n{source}");
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Waits up to a minute for `css`'s text to contain `wanted`.
pub async fn text_of(client: &Client, css: &str, wanted: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = match client.find(Locator::Css(css)).await {
            Ok(found) => found.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        if text.contains(wanted) {
            return text;
        }
        if Instant::now() > deadline {
            let source = client.source().await.unwrap_or_default();
            panic!("`{css}` never said `{wanted}` (last: `{text}`)\n{source}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Signs in through the form at `base` as account `name` with `password`; waits for the
/// signed-in page.
pub async fn sign_in(client: &Client, base: &str, name: &str, password: &str) {
    client.goto(&format!("{base}/sign-in")).await.unwrap();
    element(client, "#name")
        .await
        .send_keys(name)
        .await
        .unwrap();
    element(client, "#password")
        .await
        .send_keys(password)
        .await
        .unwrap();
    element(client, "#submit").await.click().await.unwrap();
    text_of(client, "#operator", name).await;
}

/// Signs out with the page's button; waits for the link to sign in again.
pub async fn sign_out(client: &Client) {
    element(client, "#sign-out").await.click().await.unwrap();
    element(client, "#sign-in").await;
}

/// Where a browser test's screenshots go: `WH_CONSOLE_SCREENSHOTS` (relative to the
/// repository; `docs/console` writes the README's pictures), else a folder that is removed
/// when the second value is dropped.
pub fn screenshot_dir() -> (PathBuf, Option<tempfile::TempDir>) {
    match std::env::var("WH_CONSOLE_SCREENSHOTS") {
        Ok(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            let dir = if dir.is_absolute() {
                dir
            } else {
                PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join(dir)
            };
            (dir, None)
        }
        _ => {
            let temp = tempfile::tempdir().expect("a temporary folder for the screenshots");
            (temp.path().to_path_buf(), Some(temp))
        }
    }
}
