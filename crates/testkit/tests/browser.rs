//! The browser harness itself: Debian's Chromium, through a ChromeDriver of the test's own,
//! opens a page served on loopback, reads it and takes a screenshot.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use worker_testkit::Browser;

/// Serves one fixed page to every connection, until the test ends.
async fn serve_page() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request).await;
            let body =
                "<!doctype html><title>probe</title><h1 id=greeting>hello from loopback</h1>";
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_headless_chromium_opens_a_loopback_page_and_takes_a_screenshot() {
    let port = serve_page().await;
    let browser = Browser::start().await.unwrap();
    browser
        .client
        .goto(&format!("http://127.0.0.1:{port}/"))
        .await
        .unwrap();
    let heading = browser
        .client
        .find(fantoccini::Locator::Css("#greeting"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(heading, "hello from loopback");
    let shot = tempfile::tempdir().unwrap();
    let path = shot.path().join("page.png");
    browser.screenshot(&path).await.unwrap();
    let png = std::fs::read(&path).unwrap();
    assert_eq!(&png[..4], b"\x89PNG", "a PNG file");
    browser.close().await;
}
