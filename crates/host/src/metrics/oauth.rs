//! The token sources' figures, read at each collection: requests made, and whether the last
//! one failed.

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;
use worker_mail_auth::TokenSources;

use super::names;

pub fn register(meter: &Meter, sources: &TokenSources) {
    if sources.is_empty() {
        return;
    }
    let label = |name: &str| [KeyValue::new("source", name.to_string())];
    let counted = sources.clone();
    meter
        .u64_observable_counter(names::OAUTH_TOKEN_REQUESTS)
        .with_description("token requests each [oauth.NAME] source made")
        .with_callback(move |o| {
            for (name, source) in counted.iter() {
                o.observe(source.requests(), &label(name));
            }
        })
        .build();
    let watched = sources.clone();
    meter
        .u64_observable_gauge(names::OAUTH_TOKEN_FAILING)
        .with_description("1 while a token source's last request failed")
        .with_callback(move |o| {
            for (name, source) in watched.iter() {
                o.observe(u64::from(source.failing()), &label(name));
            }
        })
        .build();
}
