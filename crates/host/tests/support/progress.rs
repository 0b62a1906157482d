//! A wait bounded by progress, not by the clock: for a test that proves work finishes (a
//! backlog drains, nothing is lost), not how fast it finishes. How long a backlog takes
//! depends on how loaded the machine is; a host that stopped working does not. So the wait
//! goes on while the counts it watches keep moving, and fails when none of them moved for
//! `stall`, when the probe reports something broken, or past a generous overall `cap`. On
//! failure it prints the counts over time, which tell a uniformly slow drain from a tail of
//! work stuck somewhere.

use std::fmt::Write as _;
use std::future::Future;
use std::time::{Duration, Instant};

/// What one look at the work finds.
pub enum Look {
    /// Still under way; the counts that grow as the work progresses.
    Working(Vec<i64>),
    /// Finished, with the final counts.
    Done(Vec<i64>),
    /// Something went wrong that waiting cannot mend (a dead letter, a duplicate): fail now.
    Broken(String),
}

/// The counts as they were at each moment they were looked at.
#[derive(Default)]
pub struct History {
    labels: Vec<&'static str>,
    samples: Vec<(Duration, Vec<i64>)>,
}

impl History {
    /// How long the wait took, from its start to the last look.
    pub fn took(&self) -> Duration {
        self.samples.last().map_or(Duration::ZERO, |(at, _)| *at)
    }

    /// The counts over time, one line per `every` (and the last look), with each count's gain
    /// per second since the line before.
    pub fn table(&self, every: Duration) -> String {
        let mut text = format!("{:>7}  {}", "t", self.labels.join("  "));
        let mut shown: Option<&(Duration, Vec<i64>)> = None;
        for (i, sample) in self.samples.iter().enumerate() {
            let last = i + 1 == self.samples.len();
            let due = shown.is_none_or(|(at, _)| sample.0 >= *at + every);
            if !(due || last) {
                continue;
            }
            let _ = write!(text, "\n{:>6.1}s", sample.0.as_secs_f64());
            for (n, count) in sample.1.iter().enumerate() {
                let rate = shown.map(|(at, before)| {
                    let secs = (sample.0 - *at).as_secs_f64().max(0.001);
                    (count - before[n]) as f64 / secs
                });
                match rate {
                    Some(rate) => {
                        let _ = write!(text, "  {}={count} ({rate:+.0}/s)", self.labels[n]);
                    }
                    None => {
                        let _ = write!(text, "  {}={count}", self.labels[n]);
                    }
                }
            }
            shown = Some(sample);
        }
        text
    }
}

/// Looks at the work every `poll` until `look` finds it done; fails (naming `what`, with the
/// counts over time and `context()`, a host's log tail say) when no count named in `labels`
/// changed for `stall`, when `look` finds it broken, or after `cap` in all. A look that errs
/// (the database busy, say) counts as no progress.
pub async fn wait_while_progressing<F, Fut>(
    what: &str,
    labels: &[&'static str],
    (stall, cap, poll): (Duration, Duration, Duration),
    context: impl Fn() -> String,
    mut look: F,
) -> History
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Look>>,
{
    let began = Instant::now();
    let mut history = History {
        labels: labels.to_vec(),
        samples: Vec::new(),
    };
    let mut last_moved = began;
    let mut last_error = String::from("(none)");
    loop {
        let at = began.elapsed();
        let failure = match look().await {
            Ok(Look::Done(counts)) => {
                history.samples.push((at, counts));
                return history;
            }
            Ok(Look::Broken(why)) => Some(format!("{what}: {why}")),
            Ok(Look::Working(counts)) => {
                let moved = history
                    .samples
                    .last()
                    .is_none_or(|(_, before)| *before != counts);
                if moved {
                    last_moved = Instant::now();
                }
                history.samples.push((at, counts));
                None
            }
            Err(err) => {
                last_error = format!("{err:#}");
                None
            }
        };
        let failure = failure.or_else(|| {
            if last_moved.elapsed() > stall {
                Some(format!(
                    "{what}: no progress for {stall:?} (after {:.1}s; last error: {last_error})",
                    at.as_secs_f64()
                ))
            } else if began.elapsed() > cap {
                Some(format!(
                    "{what}: still progressing, but not done within the cap of {cap:?} (last error: {last_error})"
                ))
            } else {
                None
            }
        });
        if let Some(failure) = failure {
            panic!(
                "{failure}\n--- counts over time ---\n{}\n{}",
                history.table(Duration::from_secs(5)),
                context()
            );
        }
        tokio::time::sleep(poll).await;
    }
}
