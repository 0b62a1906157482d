//! The frame around every page (installation, replica, who is signed in, the session's CSRF
//! token), rendered from the console's settings; the rest of what pages share (a problem
//! shown as a page or as JSON, the guards on reading and acting) is `crate::page`.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse};
use minijinja::Value;
use serde::Serialize;

use super::Console;
use super::access::Caller;
pub use crate::page::*;

/// The frame of every page.
#[derive(Debug, Serialize)]
struct Chrome {
    installation: String,
    replica: String,
    /// Who is signed in (`alice`, or `bootstrap (alice)`).
    operator: Option<String>,
    /// Their role.
    role: Option<String>,
    /// The session's token for every form that acts.
    csrf: Option<String>,
    /// The caller may act: the pages show the buttons that do.
    acts: bool,
    /// The caller may manage accounts.
    admin: bool,
    open_reading: bool,
    /// `admin.environment`: the band at the top of every page.
    environment: Option<worker_pages::environment::Environment>,
}

/// Renders page `template` with `context`, framed for the caller.
pub fn render(console: &Console, caller: &Caller, template: &str, context: Value) -> PageResult {
    let chrome = Chrome {
        installation: console.installation.clone(),
        replica: console.replica.clone(),
        operator: caller.signed.as_ref().map(super::access::Signed::label),
        role: caller.signed.as_ref().map(|s| s.role.to_string()),
        csrf: caller.csrf().map(str::to_string),
        acts: caller.acts() && caller.csrf().is_some(),
        admin: caller
            .signed
            .as_ref()
            .is_some_and(|s| s.role >= worker_store::operators::Role::Admin)
            && caller.csrf().is_some(),
        open_reading: console.access.open_reading(),
        environment: console.environment.clone(),
    };
    let context = minijinja::context! { chrome => Value::from_serialize(&chrome), ..context };
    console
        .views
        .render(template, context)
        .map(|html| Html(html).into_response())
        .map_err(|e| {
            // The whole report (the template's source and its variables) goes to the log
            // only: the page says which template and line.
            tracing::error!(template, error = %format!("{e:#}"), "a console page failed to render");
            Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "This page failed to render",
                e.to_string(),
            )
        })
}

/// The console's state, as handlers take it.
pub type State = axum::extract::State<Arc<Console>>;
