//! [`Circuits`]: one replica's handle on the circuits. It counts the calls to each dependency
//! (`worker_core::circuit::Counter`), opens a circuit in the table when they say so, and keeps
//! a view of the open ones that the host refreshes on every notice and poll, so that asking
//! whether a dependency may be called costs no statement.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use tokio::sync::watch;
use worker_core::circuit::{CircuitSettings, Counter, Fault};

use super::table::{self, OpenCircuit};

/// How long a taken probe keeps the others off: a probe that outlives it (its replica died)
/// is taken again by another.
const PROBE_BOUND: Duration = Duration::from_secs(60);

/// Whether a call to a dependency may go ahead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Its circuit is closed.
    Go,
    /// Its circuit is open and this call is its probe: tell [`Circuits::succeeded`] or
    /// [`Circuits::failed`] how it went.
    Probe,
    /// Its circuit is open: do not call it. `reason` is why it opened, `probe_in` the time
    /// until its next probe.
    Wait { reason: String, probe_in: Duration },
}

/// A dependency as this replica reports it: open or not, and how often this replica opened it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CircuitReport {
    pub dependency: String,
    pub open: Option<OpenCircuit>,
    /// Times this replica's failures opened it since it started.
    pub opened_here: u64,
}

/// One replica's handle on the circuits (see the module docs). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Circuits {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: PgPool,
    settings: CircuitSettings,
    replica: String,
    open: RwLock<BTreeMap<String, OpenCircuit>>,
    counters: Mutex<HashMap<String, Counter>>,
    opened_here: Mutex<BTreeMap<String, u64>>,
    changed: watch::Sender<u64>,
}

impl Circuits {
    /// A handle for `replica` (the name its log lines and the table give it).
    pub fn new(pool: PgPool, settings: CircuitSettings, replica: impl Into<String>) -> Self {
        Self {
            inner: Arc::new(Inner {
                pool,
                settings,
                replica: replica.into(),
                open: RwLock::default(),
                counters: Mutex::default(),
                opened_here: Mutex::default(),
                changed: watch::channel(0).0,
            }),
        }
    }

    pub fn settings(&self) -> &CircuitSettings {
        &self.inner.settings
    }

    /// Changes of this replica's view of the open circuits (a counter that goes up).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    /// `dependency`'s open circuit, as this replica last saw it.
    pub fn open_circuit(&self, dependency: &str) -> Option<OpenCircuit> {
        self.read().get(dependency).cloned()
    }

    /// Every open circuit, as this replica last saw them.
    pub fn open_circuits(&self) -> Vec<OpenCircuit> {
        self.read().values().cloned().collect()
    }

    /// Every dependency this replica has called or seen open, with its state.
    pub fn report(&self) -> Vec<CircuitReport> {
        let open = self.read().clone();
        let opened_here = self.inner.opened_here.lock().map(|m| m.clone());
        let opened_here = opened_here.unwrap_or_default();
        let mut names: Vec<String> = self
            .inner
            .counters
            .lock()
            .map(|c| c.keys().cloned().collect())
            .unwrap_or_default();
        names.extend(open.keys().cloned());
        names.sort();
        names.dedup();
        names
            .into_iter()
            .map(|dependency| CircuitReport {
                open: open.get(&dependency).cloned(),
                opened_here: opened_here.get(&dependency).copied().unwrap_or(0),
                dependency,
            })
            .collect()
    }

    /// Takes the table's open circuits as this replica's view (the host's watcher calls this
    /// on every notice and poll), logging what opened or closed elsewhere.
    pub fn apply(&self, circuits: Vec<OpenCircuit>) {
        let fresh: BTreeMap<String, OpenCircuit> = circuits
            .into_iter()
            .map(|c| (c.dependency.clone(), c))
            .collect();
        let mut view = self.write();
        for (name, circuit) in &fresh {
            if !view.contains_key(name) {
                tracing::warn!(dependency = %name, reason = %circuit.reason, opened_by = %circuit.opened_by, "circuit open: not calling {name} until a probe succeeds");
            }
        }
        for name in view.keys() {
            if !fresh.contains_key(name) {
                tracing::info!(dependency = %name, "circuit closed: calling {name} again");
                self.reset(name);
            }
        }
        let changed = *view != fresh;
        *view = fresh;
        drop(view);
        if changed {
            self.inner.changed.send_modify(|n| *n += 1);
        }
    }

    /// Whether `dependency` may be called now (see [`Admission`]). Asks the table only when
    /// its circuit is open and its probe due, to take the probe.
    pub async fn admit(&self, dependency: &str) -> Admission {
        self.note(dependency);
        let Some(open) = self.open_circuit(dependency) else {
            return Admission::Go;
        };
        let wait = |probe_in| Admission::Wait {
            reason: open.reason.clone(),
            probe_in,
        };
        let probe_in = open.probe_in(Utc::now());
        if !probe_in.is_zero() {
            return wait(probe_in);
        }
        let inner = &self.inner;
        match table::take_probe(&inner.pool, dependency, &inner.replica, PROBE_BOUND).await {
            Ok(true) => {
                tracing::info!(dependency, "probing the open circuit");
                Admission::Probe
            }
            Ok(false) => wait(inner.settings.cool_down),
            Err(err) => {
                tracing::debug!(dependency, error = %err, "could not take the circuit's probe");
                wait(inner.settings.cool_down)
            }
        }
    }

    /// A call that went through (`admission` as [`Circuits::admit`] gave it): a probe's
    /// success closes the circuit on every replica.
    pub async fn succeeded(&self, dependency: &str, admission: &Admission) {
        if let Ok(mut counters) = self.inner.counters.lock() {
            counters
                .entry(dependency.to_string())
                .or_default()
                .succeeded(&self.inner.settings, Instant::now());
        }
        if *admission != Admission::Probe {
            return;
        }
        match table::close(&self.inner.pool, dependency).await {
            Ok(_) => {
                tracing::info!(dependency, "circuit closed: the probe succeeded");
                self.forget(dependency);
            }
            Err(err) => {
                tracing::warn!(dependency, error = %err, "the probe succeeded but the circuit could not be closed; the next probe will")
            }
        }
    }

    /// A call that failed with the dependency's own `fault`, in its words `detail`. The time
    /// until the next probe when its circuit is open now (the call's work is then charged
    /// nothing: see `worker_core::Failure::Unavailable`); none when it stays closed.
    pub async fn failed(
        &self,
        dependency: &str,
        fault: Fault,
        detail: &str,
        admission: &Admission,
    ) -> Option<Duration> {
        let inner = &self.inner;
        if *admission == Admission::Probe {
            return match table::probe_failed(&inner.pool, dependency, detail, &inner.settings).await
            {
                Ok(Some(circuit)) => {
                    let probe_in = circuit.probe_in(Utc::now());
                    tracing::warn!(dependency, reason = detail, next_probe_in = %humantime::format_duration(round(probe_in)), "the probe failed: the circuit stays open");
                    self.remember(circuit);
                    Some(probe_in)
                }
                Ok(None) => None,
                Err(err) => {
                    tracing::warn!(dependency, error = %err, "could not record the failed probe");
                    Some(inner.settings.cool_down)
                }
            };
        }
        if let Some(open) = self.open_circuit(dependency) {
            return Some(open.probe_in(Utc::now()));
        }
        let opens = inner.counters.lock().is_ok_and(|mut counters| {
            counters.entry(dependency.to_string()).or_default().failed(
                &inner.settings,
                fault,
                Instant::now(),
            )
        });
        if !opens {
            return None;
        }
        let cool_down = inner.settings.cool_down;
        match table::open(&inner.pool, dependency, detail, &inner.replica, cool_down).await {
            Ok((circuit, opened)) => {
                if opened {
                    tracing::error!(dependency, reason = detail, first_probe_in = %humantime::format_duration(cool_down), "circuit opened: not calling {dependency} until a probe succeeds");
                    if let Ok(mut counts) = inner.opened_here.lock() {
                        *counts.entry(dependency.to_string()).or_default() += 1;
                    }
                }
                let probe_in = circuit.probe_in(Utc::now());
                self.remember(circuit);
                self.reset(dependency);
                Some(probe_in)
            }
            Err(err) => {
                tracing::warn!(dependency, error = %err, "could not open the circuit; the call counts as the work's own failure");
                None
            }
        }
    }

    /// Opens `dependency`'s circuit until `until`, whatever this replica's counts say: the
    /// dependency said, in its words `reason`, that it takes no more before then (a provider's
    /// sending quota: the window rolls over at `until`). An open circuit probes no sooner than
    /// `until`. The time until its next probe; none when it could not be opened (the call then
    /// counts as its work's own failure).
    pub async fn open_until(
        &self,
        dependency: &str,
        reason: &str,
        until: DateTime<Utc>,
    ) -> Option<Duration> {
        let inner = &self.inner;
        match table::open_until(&inner.pool, dependency, reason, &inner.replica, until).await {
            Ok((circuit, opened)) => {
                let probe_in = circuit.probe_in(Utc::now());
                let next_probe_in = humantime::format_duration(round(probe_in));
                if opened {
                    tracing::error!(dependency, reason, %next_probe_in, "circuit opened until the dependency's window rolls over");
                    if let Ok(mut counts) = inner.opened_here.lock() {
                        *counts.entry(dependency.to_string()).or_default() += 1;
                    }
                } else {
                    tracing::warn!(dependency, reason, %next_probe_in, "the open circuit stays open until the dependency's window rolls over");
                }
                self.remember(circuit);
                self.reset(dependency);
                Some(probe_in)
            }
            Err(err) => {
                tracing::warn!(dependency, error = %err, "could not open the circuit until the window rolls over");
                None
            }
        }
    }

    fn note(&self, dependency: &str) {
        if let Ok(mut counters) = self.inner.counters.lock()
            && !counters.contains_key(dependency)
        {
            counters.insert(dependency.to_string(), Counter::default());
        }
    }

    fn reset(&self, dependency: &str) {
        if let Ok(mut counters) = self.inner.counters.lock()
            && let Some(counter) = counters.get_mut(dependency)
        {
            counter.reset();
        }
    }

    fn remember(&self, circuit: OpenCircuit) {
        let changed = {
            let mut view = self.write();
            let old = view.insert(circuit.dependency.clone(), circuit.clone());
            old.as_ref() != Some(&circuit)
        };
        if changed {
            self.inner.changed.send_modify(|n| *n += 1);
        }
    }

    fn forget(&self, dependency: &str) {
        self.reset(dependency);
        if self.write().remove(dependency).is_some() {
            self.inner.changed.send_modify(|n| *n += 1);
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, OpenCircuit>> {
        self.inner
            .open
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, OpenCircuit>> {
        self.inner
            .open
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn round(wait: Duration) -> Duration {
    Duration::from_secs(wait.as_secs())
}
