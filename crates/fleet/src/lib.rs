//! The fleet view (`worker-host fleet --config fleet.toml`, a crate of its own that knows
//! neither the host nor the console): one page over every installation
//! an operator looks after, each read from its own admin address with a `viewer` account's
//! API token, as the console's pages are made (server-rendered, no script, the same
//! stylesheet and Content-Security-Policy), with `/api/fleet` as its JSON twin.
//!
//! - `settings.rs`: the fleet view's own settings file;
//! - `poll.rs`: the background reading of every installation, each bounded by `timeout`.

pub mod poll;
pub mod settings;

use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Json, Response};
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use poll::{Fleet, Shared};
use settings::FleetSettings;
use worker_pages::Views;
use worker_pages::allowed_hosts::AllowedHosts;
use worker_pages::secure;

/// Why the view stopped, as the command's exit code tells it.
#[derive(Debug, thiserror::Error)]
pub enum Stopped {
    /// The listening address cannot be taken: worth retrying later.
    #[error("{0}")]
    Unavailable(String),
    /// Anything else.
    #[error("{0}")]
    Software(String),
}

/// What the page's handlers read.
#[derive(Debug, Clone)]
struct View {
    fleet: Shared,
    views: Arc<Views>,
    /// The release of the program serving the view, shown in its footer.
    release: &'static str,
}

/// Serves the view on `settings.listen` and reads the installations until `signal` ends
/// (the command's SIGTERM or SIGINT); `release` is the program's, shown on the page.
pub async fn run(
    settings: FleetSettings,
    release: &'static str,
    signal: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Stopped> {
    let views = Views::new()
        .map_err(|e| Stopped::Software(format!("the fleet page does not compile: {e:#}")))?;
    let client = reqwest::Client::builder()
        // A redirect is a sign-in page: the token was not taken.
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(settings.timeout)
        .user_agent(concat!("worker-host-fleet/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| Stopped::Software(format!("the HTTP client cannot start: {e}")))?;
    let fleet: Shared = Arc::new(RwLock::new(Fleet::new(&settings)));
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|e| {
            Stopped::Unavailable(format!(
                "the fleet view cannot listen on {}: {e}",
                settings.listen
            ))
        })?;
    tracing::info!(
        listen = %settings.listen,
        installations = settings.installations.len(),
        "fleet view listening"
    );
    let shutdown = CancellationToken::new();
    let settings = Arc::new(settings);
    let poller = tokio::spawn(poll::run(
        settings.clone(),
        client,
        fleet.clone(),
        shutdown.clone(),
    ));
    let allowed_hosts =
        AllowedHosts::new(settings.listen, &settings.allowed_hosts, "allowed_hosts");
    let app = router(
        View {
            fleet,
            views: Arc::new(views),
            release,
        },
        allowed_hosts,
    );
    let stop = shutdown.clone();
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            signal.await;
            stop.cancel();
        })
        .await;
    shutdown.cancel();
    let _ = poller.await;
    served.map_err(|e| Stopped::Software(format!("the fleet view stopped: {e}")))
}

/// The page, its JSON twin, its stylesheet and `/healthz`, each only for a request that names
/// this view in `Host` (`allowed_hosts`, against DNS rebinding).
fn router(view: View, allowed_hosts: AllowedHosts) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/api/fleet", get(api))
        .route("/console.css", get(worker_pages::stylesheet))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(view)
        .layer(axum::middleware::from_fn_with_state(
            allowed_hosts,
            worker_pages::allowed_hosts::guard,
        ))
        .layer(axum::middleware::map_response(secure))
        // The handlers only read memory; the bound is for a client that never finishes.
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            std::time::Duration::from_secs(10),
        ))
}

fn snapshot(view: &View) -> Fleet {
    view.fleet.read().map(|f| f.clone()).unwrap_or_default()
}

/// `?reload=auto`: the page reloads itself every `refresh`. Only when asked: a page that
/// reloads on its own timer moves a reader's place and a screen reader's (WCAG 2.2.1).
#[derive(Debug, serde::Deserialize)]
struct Reload {
    reload: Option<String>,
}

async fn page(State(view): State<View>, Query(reload): Query<Reload>) -> Response {
    let fleet = snapshot(&view);
    let context = minijinja::context! {
        f => minijinja::Value::from_serialize(&fleet),
        release => view.release,
        auto_reload => reload.reload.as_deref() == Some("auto"),
    };
    match view.views.render("fleet.html", context) {
        Ok(html) => Html(html).into_response(),
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "the fleet page failed to render");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the fleet page failed to render: {e}"),
            )
                .into_response()
        }
    }
}

async fn api(State(view): State<View>) -> Json<Fleet> {
    Json(snapshot(&view))
}
