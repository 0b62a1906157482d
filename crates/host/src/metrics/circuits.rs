//! The dependencies' circuits, read at each collection from this replica's handle: whether
//! each is open (the same on every replica, from the shared table) and how often this
//! replica's failures opened it.

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;
use worker_store::circuits::Circuits;

use super::names;

pub fn register(meter: &Meter, circuits: &Circuits) {
    let label = |dependency: &str| [KeyValue::new("dependency", dependency.to_string())];
    let watched = circuits.clone();
    meter
        .u64_observable_gauge(names::CIRCUIT_STATE)
        .with_description("1 while the dependency's circuit is open, else 0")
        .with_callback(move |o| {
            for report in watched.report() {
                o.observe(u64::from(report.open.is_some()), &label(&report.dependency));
            }
        })
        .build();
    let counted = circuits.clone();
    meter
        .u64_observable_counter(names::CIRCUIT_OPENED)
        .with_description("times this replica's failures opened the dependency's circuit")
        .with_callback(move |o| {
            for report in counted.report() {
                o.observe(report.opened_here, &label(&report.dependency));
            }
        })
        .build();
}
