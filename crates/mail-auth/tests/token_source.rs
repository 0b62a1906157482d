//! Token sources against the test kit's token endpoint (`scripts/oauth_endpoint.py`), each
//! test with a client of its own: one cached token per source, one request in flight, a
//! renewal a margin before expiry, refusals of the settings permanent and not asked again,
//! a 5xx or a 429 transient, and each of the three flows.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::Duration;

use worker_core::Secret;
use worker_mail_auth::{Flow, OAuthSettings, TokenError, TokenSource};
use worker_testkit::oauth::{ClientSpec, OAuthClient, service_account_key, unique_client_id};

fn app_only(client: &OAuthClient) -> OAuthSettings {
    client.app_only()
}

#[tokio::test]
async fn a_token_is_asked_for_once_and_then_served_from_the_cache() -> anyhow::Result<()> {
    let client = OAuthClient::register("cache", &ClientSpec::default()).await?;
    let source = TokenSource::new("m365", &app_only(&client))?;
    let first = source.token().await?;
    assert_eq!(first.len(), 2000, "the endpoint's long token, whole");
    for _ in 0..5 {
        let again = source.token().await?;
        assert_eq!(again.expose(), first.expose());
    }
    assert_eq!(source.requests(), 1);
    assert_eq!(client.stats().await?.token_requests, 1);
    Ok(())
}

#[tokio::test]
async fn callers_at_once_share_one_request() -> anyhow::Result<()> {
    let client = OAuthClient::register("flight", &ClientSpec::default()).await?;
    let source = TokenSource::new("m365", &app_only(&client))?;
    let tokens = futures_join(&source, 20).await;
    assert!(tokens.iter().all(|t| t == &tokens[0]));
    assert_eq!(client.stats().await?.token_requests, 1);
    Ok(())
}

async fn futures_join(source: &TokenSource, n: usize) -> Vec<String> {
    let calls = (0..n).map(|_| source.token());
    futures::future::join_all(calls)
        .await
        .into_iter()
        .map(|t| t.unwrap().expose().to_string())
        .collect()
}

#[tokio::test]
async fn a_token_is_renewed_a_margin_before_it_expires() -> anyhow::Result<()> {
    let spec = ClientSpec {
        lifetime: 3,
        ..ClientSpec::default()
    };
    let client = OAuthClient::register("renew", &spec).await?;
    let source = TokenSource::new("m365", &app_only(&client))?;
    let first = source.token().await?;
    // A third of 3 s is the margin: the token is renewed from 2 s on, before it expires.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let second = source.token().await?;
    assert_ne!(first.expose(), second.expose());
    assert!(
        first.expires_at() > tokio::time::Instant::now(),
        "renewed before expiry"
    );
    assert_eq!(client.stats().await?.token_requests, 2);
    Ok(())
}

#[tokio::test]
async fn a_dropped_token_is_replaced_by_a_fresh_one() -> anyhow::Result<()> {
    let client = OAuthClient::register("drop", &ClientSpec::default()).await?;
    let source = TokenSource::new("m365", &app_only(&client))?;
    let first = source.token().await?;
    source.invalidate(&first);
    let second = source.token().await?;
    assert_ne!(first.expose(), second.expose());
    // Dropping the old one again drops nothing: the fresh token stays.
    source.invalidate(&first);
    assert_eq!(source.token().await?.expose(), second.expose());
    assert_eq!(source.requests(), 2);
    Ok(())
}

#[tokio::test]
async fn a_wrong_secret_is_permanent_said_plainly_and_not_asked_again() -> anyhow::Result<()> {
    let client = OAuthClient::register("wrong", &ClientSpec::default()).await?;
    let settings = OAuthSettings {
        client_secret: Some(Secret::new("not-the-secret")),
        ..app_only(&client)
    };
    let source = TokenSource::new("m365", &settings)?;
    let err = source.token().await.expect_err("a wrong secret");
    assert!(err.is_permanent(), "{err}");
    let text = err.to_string();
    assert!(text.contains("invalid_client"), "{text}");
    assert!(text.contains("check client_id and client_secret"), "{text}");
    assert!(
        !text.contains("not-the-secret"),
        "the secret is never said: {text}"
    );
    for _ in 0..10 {
        assert_eq!(source.token().await.expect_err("still refused"), err);
    }
    assert_eq!(client.stats().await?.token_requests, 1, "no retry storm");
    Ok(())
}

#[tokio::test]
async fn an_endpoint_that_fails_or_throttles_is_transient() -> anyhow::Result<()> {
    let client = OAuthClient::register("away", &ClientSpec::default()).await?;
    client.fail_next(503, 1, None).await?;
    let source = TokenSource::new("m365", &app_only(&client))?;
    let err = source.token().await.expect_err("a 503");
    assert!(!err.is_permanent(), "{err}");
    assert!(err.to_string().contains("HTTP 503"), "{err}");

    client.fail_next(429, 1, Some(7)).await?;
    let throttled = TokenSource::new("m365", &app_only(&client))?;
    let err = throttled.token().await.expect_err("a 429");
    assert!(matches!(err, TokenError::Unavailable { .. }), "{err}");
    assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
    Ok(())
}

#[tokio::test]
async fn a_refresh_token_gives_tokens_and_an_unknown_one_is_permanent() -> anyhow::Result<()> {
    let client = OAuthClient::register("delegated", &ClientSpec::default()).await?;
    let refresh = client.refresh_token("alice").await?;
    let settings = OAuthSettings {
        flow: Some(Flow::RefreshToken),
        refresh_token: Some(Secret::new(refresh)),
        scope: Some("https://mail.google.com/".into()),
        ..app_only(&client)
    };
    let source = TokenSource::new("google", &settings)?;
    assert_eq!(source.token().await?.len(), 2000);

    let revoked = OAuthSettings {
        refresh_token: Some(Secret::new("refresh-that-was-never-issued")),
        ..settings
    };
    let err = TokenSource::new("google", &revoked)?
        .token()
        .await
        .expect_err("an unknown refresh token");
    assert!(err.is_permanent(), "{err}");
    assert!(err.to_string().contains("invalid_grant"), "{err}");
    Ok(())
}

#[tokio::test]
async fn a_service_account_signs_its_assertion_and_acts_for_its_subject() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let email = format!("{}@wh-test.iam.gserviceaccount.com", unique_client_id("sa"));
    let (key_file, public_key) = service_account_key(dir.path(), &email)?;
    let spec = ClientSpec {
        mailboxes: vec!["alice".into()],
        public_key: Some(public_key),
        ..ClientSpec::default()
    };
    let client = OAuthClient::register_as(&email, &spec).await?;
    let settings = |subject: &str| OAuthSettings {
        flow: Some(Flow::ServiceAccount),
        token_url: Some(client.token_url()),
        scope: Some("https://mail.google.com/".into()),
        key_file: Some(key_file.clone()),
        subject: Some(subject.into()),
        ..OAuthSettings::default()
    };
    let source = TokenSource::new("google-sa", &settings("alice"))?;
    assert_eq!(source.token().await?.len(), 2000);

    let undelegated = TokenSource::new("google-sa", &settings("mallory"))?;
    let err = undelegated.token().await.expect_err("not delegated");
    assert!(err.is_permanent(), "{err}");
    assert!(err.to_string().contains("invalid_grant"), "{err}");
    Ok(())
}

#[tokio::test]
async fn a_token_url_in_plain_http_to_another_host_is_refused_at_setup() {
    let settings = OAuthSettings {
        flow: Some(Flow::ClientCredentials),
        token_url: Some("http://login.example.com/token".into()),
        scope: Some("x".into()),
        client_id: Some("app".into()),
        client_secret: Some(Secret::new("s")),
        ..OAuthSettings::default()
    };
    let err = TokenSource::new("m365", &settings).expect_err("plain http");
    assert!(err.to_string().contains("use https"), "{err}");
}
