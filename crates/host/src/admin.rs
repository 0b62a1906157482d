//! The admin HTTP server: `/healthz` (the process is alive), `/readyz` (the database and
//! the broker are reachable), `/status`, `/metrics` (both behind `admin.scrape_token` when it
//! is set) and the operator's [`console`](crate::console), on `admin.listen`. Every response
//! carries the console's security headers. Every request, these endpoints' too, must name
//! this server in `Host` ([`worker_pages::allowed_hosts`], against DNS rebinding).
//!
//! The server is bounded ([`Limits`]): a client has `admin.header_timeout` to send a
//! request's headers (a slow client cannot hold a connection open by trickling them), a
//! request has `admin.request_timeout` to be answered, and at most `admin.max_connections`
//! are served at once; past that, new ones wait in the listen backlog.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::console::Console;
use crate::metrics::PrometheusReader;
use crate::readiness::Readiness;
use crate::status::StatusBoard;
use worker_pages::allowed_hosts::AllowedHosts;
use worker_pages::secure;

/// The admin endpoint's base URL as a client on this machine reaches it (`worker-host status`
/// and `health`): an address that listens on every interface is asked on loopback.
pub fn local_url(listen: SocketAddr) -> String {
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, listen.port()))
}

#[derive(Clone)]
pub struct AdminState {
    readiness: Readiness,
    prometheus: Option<PrometheusReader>,
    status: Option<StatusBoard>,
    console: Option<Arc<Console>>,
    /// The schema found at start, shown on `/readyz` beside the checks.
    schema: Option<worker_store::schema::SchemaVersion>,
    /// The host names a request may name (`admin.allowed_hosts`); loopback only until set.
    allowed_hosts: AllowedHosts,
}

impl std::fmt::Debug for AdminState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminState")
            .field("readiness", &self.readiness)
            .finish()
    }
}

impl AdminState {
    pub fn new(readiness: Readiness) -> Self {
        Self {
            readiness,
            prometheus: None,
            status: None,
            console: None,
            schema: None,
            allowed_hosts: AllowedHosts::new(
                SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
                &[],
                "admin.allowed_hosts",
            ),
        }
    }

    /// Answers requests for `admin.listen`, loopback and the names `admin.allowed_hosts`
    /// lists; refuses the others (421).
    pub fn with_allowed_hosts(mut self, admin: &crate::settings::AdminSettings) -> Self {
        self.allowed_hosts =
            AllowedHosts::new(admin.listen, &admin.allowed_hosts, "admin.allowed_hosts");
        self
    }

    /// Shows the schema's version (highest migration, the release that applied it) on
    /// `/readyz`.
    pub fn with_schema(mut self, schema: Option<worker_store::schema::SchemaVersion>) -> Self {
        self.schema = schema;
        self
    }

    /// Serves the operator's console beside the endpoints.
    pub fn with_console(mut self, console: Arc<Console>) -> Self {
        self.console = Some(console);
        self
    }

    /// Serves `/status` from this board.
    pub fn with_status(mut self, status: StatusBoard) -> Self {
        self.status = Some(status);
        self
    }

    /// Serves `/metrics` from this reader.
    pub fn with_metrics(mut self, prometheus: PrometheusReader) -> Self {
        self.prometheus = Some(prometheus);
        self
    }
}

pub fn router(state: AdminState) -> Router {
    let console = state.console.clone();
    let allowed_hosts = state.allowed_hosts.clone();
    let scraped = Router::new()
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            scrape_guard,
        ));
    let endpoints = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .merge(scraped)
        .with_state(state);
    let router = match console {
        Some(console) => endpoints.merge(crate::console::routes(console)),
        None => endpoints,
    };
    router
        .layer(axum::middleware::from_fn_with_state(
            allowed_hosts,
            worker_pages::allowed_hosts::guard,
        ))
        .layer(axum::middleware::map_response(secure))
}

/// `/metrics` and `/status` only with the scrape token, when one is set.
async fn scrape_guard(State(state): State<AdminState>, request: Request, next: Next) -> Response {
    if let Some(console) = &state.console {
        let peer = request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map_or(SocketAddr::from(([0, 0, 0, 0], 0)), |c| c.0);
        if let Err(refusal) = console
            .access
            .may_scrape(&console.pool, peer, request.headers())
            .await
        {
            let retry = crate::console::caller::retry_after(&refusal);
            let mut response = crate::console::caller::with_retry_after(
                crate::console::page::Problem::from(refusal)
                    .json()
                    .into_response(),
                retry,
            );
            if response.status() == StatusCode::UNAUTHORIZED {
                response.headers_mut().insert(
                    axum::http::header::WWW_AUTHENTICATE,
                    axum::http::HeaderValue::from_static("Bearer"),
                );
            }
            return response;
        }
    }
    next.run(request).await
}

/// What bounds the admin server.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub request_timeout: Duration,
}

impl Limits {
    pub fn of(admin: &crate::settings::AdminSettings) -> Self {
        Self {
            max_connections: usize::try_from(admin.max_connections).unwrap_or(usize::MAX),
            header_timeout: admin.header_timeout,
            request_timeout: admin.request_timeout,
        }
    }
}

/// Binds the admin port (failing at start, with the address, when it is taken) and serves
/// until `shutdown` fires, then lets the requests in progress finish (for
/// `request_timeout` at most).
pub async fn serve(
    listen: SocketAddr,
    limits: Limits,
    state: AdminState,
    shutdown: CancellationToken,
) -> anyhow::Result<impl std::future::Future<Output = std::io::Result<()>>> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| anyhow::anyhow!("the admin server cannot listen on {listen}: {e}"))?;
    tracing::info!(%listen, max_connections = limits.max_connections, "admin server listening");
    let app = router(state).layer(tower_http::timeout::TimeoutLayer::with_status_code(
        StatusCode::REQUEST_TIMEOUT,
        limits.request_timeout,
    ));
    Ok(accept_loop(listener, app, limits, shutdown))
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: Limits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit,
            () = shutdown.cancelled() => break,
        };
        let Ok(permit) = permit else { break };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, say: wait rather than spin.
                    tracing::warn!(error = %e, "the admin server could not accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        // The peer's address: the console records where an operator acted from.
        let service =
            app.clone()
                .map_request(move |mut request: Request<hyper::body::Incoming>| {
                    request.extensions_mut().insert(ConnectInfo(peer));
                    request
                });
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .serve_connection(
                TokioIo::new(stream),
                hyper_util::service::TowerToHyperService::new(service),
            );
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(%peer, error = %e, "an admin connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.request_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("admin connections still open at shutdown were dropped");
    }
    Ok(())
}

async fn metrics(State(state): State<AdminState>) -> axum::response::Response {
    let Some(reader) = &state.prometheus else {
        return (
            StatusCode::NOT_FOUND,
            "metrics are not collected by this process\n",
        )
            .into_response();
    };
    match reader.render() {
        Ok(text) => (
            [(
                axum::http::header::CONTENT_TYPE,
                crate::metrics::exposition::CONTENT_TYPE,
            )],
            text,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("collecting metrics failed: {e}\n"),
        )
            .into_response(),
    }
}

async fn status(State(state): State<AdminState>) -> axum::response::Response {
    match &state.status {
        Some(board) => Json(board.render()).into_response(),
        None => (StatusCode::NOT_FOUND, "no status in this process\n").into_response(),
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    let report = state.readiness.check().await;
    let status = if report.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut body = json!({"ready": report.ready, "checks": report.checks});
    if let Some(schema) = &state.schema {
        body["schema"] = json!(schema);
    }
    (status, Json(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::readiness::ReadinessReport;

    #[test]
    fn every_interface_is_asked_on_loopback_and_a_given_address_as_given() {
        let at = |s: &str| local_url(s.parse().unwrap());
        assert_eq!(at("0.0.0.0:9180"), "http://127.0.0.1:9180");
        assert_eq!(at("[::]:9180"), "http://[::1]:9180");
        assert_eq!(at("10.0.0.5:9180"), "http://10.0.0.5:9180");
    }

    #[test]
    fn a_readyz_body_read_back_names_the_checks_that_are_down() {
        let body = r#"{"ready": false, "checks": {
            "broker": {"status": "down", "error": "connection refused"},
            "database": {"status": "up"}}}"#;
        let report: ReadinessReport = serde_json::from_str(body).unwrap();
        assert!(!report.ready);
        assert_eq!(report.failures(), "broker: connection refused");
    }
}
