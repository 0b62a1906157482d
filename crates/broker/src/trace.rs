//! W3C trace context in AMQP headers: injected on every publish from the current `tracing`
//! span, extracted on every delivery to parent the consumer's span.
//!
//! Both go through the global OpenTelemetry text-map propagator, which the host installs
//! (a `TraceContextPropagator`); without one, nothing is injected and the consumer's span
//! starts a trace of its own.

use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TraceContextExt;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::message::{HeaderValue, Headers};

/// The W3C header that carries the trace and parent span ids.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C header that carries vendor-specific trace state.
pub const TRACESTATE: &str = "tracestate";

struct HeaderInjector<'a>(&'a mut FieldTable);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let Ok(key) = ShortString::try_new(key) {
            self.0
                .insert(key, AMQPValue::LongString(LongString::from(value)));
        }
    }
}

struct HeaderExtractor<'a>(&'a FieldTable);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match self.0.inner().get(key)? {
            AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
            AMQPValue::ShortString(s) => Some(s.as_str()),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        self.0.inner().keys().map(ShortString::as_str).collect()
    }
}

struct OwnHeaderInjector<'a>(&'a mut Headers);

impl Injector for OwnHeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key, HeaderValue::text(value));
    }
}

struct OwnHeaderExtractor<'a>(&'a Headers);

impl Extractor for OwnHeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match self.0.get(key)? {
            HeaderValue::LongString(s) => std::str::from_utf8(s).ok(),
            HeaderValue::ShortString(s) => Some(s.as_str()),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(k, _)| k).collect()
    }
}

/// Writes the current span's trace context into `headers` as the publisher sends them,
/// unless they already carry one: a parked or dead-lettered copy keeps the trace of the
/// message it copies.
pub(crate) fn inject_current(headers: &mut FieldTable) {
    if headers.contains_key(TRACEPARENT) {
        return;
    }
    let cx = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut HeaderInjector(headers))
    });
}

/// Writes `span`'s trace context into `headers`, replacing any they carry: for a publish
/// whose own span stands between the message's origin and its consumers (the outbox drain's
/// per-row publish). Leaves `headers` as they are when `span` has no trace context (no
/// OpenTelemetry layer, or the span is disabled), so a trace they carry still goes on.
pub fn inject_span(span: &tracing::Span, headers: &mut Headers) {
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return;
    }
    headers.remove(TRACEPARENT);
    headers.remove(TRACESTATE);
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut OwnHeaderInjector(headers))
    });
}

/// The trace context a delivery's headers carry, as the consumer reads them (empty when
/// they carry none).
pub(crate) fn extract(headers: Option<&FieldTable>) -> opentelemetry::Context {
    match headers {
        Some(headers) => {
            opentelemetry::global::get_text_map_propagator(|p| p.extract(&HeaderExtractor(headers)))
        }
        None => opentelemetry::Context::new(),
    }
}

/// Makes `span` continue the trace in `headers`. Without an OpenTelemetry layer there is
/// nothing to continue, which is not an error.
pub fn continue_trace(span: &tracing::Span, headers: Option<&Headers>) {
    if let Some(headers) = headers.filter(|h| h.contains_key(TRACEPARENT)) {
        let cx = opentelemetry::global::get_text_map_propagator(|p| {
            p.extract(&OwnHeaderExtractor(headers))
        });
        let _ = span.set_parent(cx);
    }
}

/// [`continue_trace`] on a delivery's headers as the consumer reads them, uncopied.
pub(crate) fn continue_amqp_trace(span: &tracing::Span, headers: Option<&FieldTable>) {
    if headers.is_some_and(|h| h.contains_key(TRACEPARENT)) {
        let _ = span.set_parent(extract(headers));
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use opentelemetry_sdk::propagation::TraceContextPropagator;

    use super::*;

    #[test]
    fn trace_context_round_trips_through_headers() {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        let remote = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        let cx = opentelemetry::Context::new().with_remote_span_context(remote.clone());
        let mut headers = FieldTable::default();
        opentelemetry::global::get_text_map_propagator(|p| {
            p.inject_context(&cx, &mut HeaderInjector(&mut headers))
        });
        let Some(AMQPValue::LongString(tp)) = headers.inner().get(TRACEPARENT).cloned() else {
            panic!("no traceparent: {headers:?}")
        };
        assert_eq!(
            tp.to_string(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );

        let back = extract(Some(&headers));
        assert_eq!(back.span().span_context().trace_id(), remote.trace_id());
        assert_eq!(back.span().span_context().span_id(), remote.span_id());

        // A copy keeps the trace it carries.
        inject_current(&mut headers);
        let Some(AMQPValue::LongString(again)) = headers.inner().get(TRACEPARENT) else {
            panic!()
        };
        assert_eq!(again, &tp);

        // A span without a trace context (no OpenTelemetry layer here) replaces nothing.
        let mut own = Headers::from(&headers);
        inject_span(&tracing::info_span!("publish"), &mut own);
        assert_eq!(
            own.get(TRACEPARENT),
            Some(&HeaderValue::LongString(tp.as_bytes().to_vec()))
        );
    }
}
