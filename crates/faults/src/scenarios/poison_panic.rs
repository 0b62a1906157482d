//! `poison-panic`: a handler that panics on one message (a test build's fault-injection
//! header), while the rest of the stream flows.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{Fault, Load, Scenario};
use crate::oracle::Check;
use crate::run::{Run, Setup};

/// The email consumer's attempts in this scenario (instead of the suite's 30), so that the
/// panicking command's ladder ends within the quick run: attempt 1, then parked in the 2 s
/// and 5 s tiers, then attempts 3 and 4 (the last in the 10 s tier's place), then `gave-up`.
const MAX_ATTEMPTS: u32 = 4;

/// Panicking commands per repetition.
const PER_REPETITION: u64 = 1;

pub fn scenario() -> Scenario {
    Scenario {
        name: "poison-panic",
        about: "Needs a host built with `--features fault-injection` (`cargo build -p \
                worker-host --features fault-injection`; the shipped binary has no such hook): \
                a delivery carrying the header `x-fault-inject: panic` makes the consumer's \
                handler panic inside its unit of work, on every try. At a random moment of each \
                repetition the harness publishes one direct `email.send` command with that \
                header (its outbound email row written first, as for every direct command) \
                while pings and the other direct commands flow; the email consumer's \
                `max_attempts` is 4 here. As the host's design says (`run_unit` catches a panic \
                as a transient failure), the command must be tried in process, parked in the \
                retry tiers, and dead-lettered `gave-up` after its 4th attempt with the \
                panic's message in `x-dead-error`, exactly once; its mail is never sent; the \
                host must not exit and everything else is answered once. \"Ready again\" is \
                from the publish.",
        fault: Some(|| Box::new(PoisonPanic::default())),
        full: Load {
            repetitions: 5,
            per_repetition: 30,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 30,
        },
        rate_per_sec: 10.0,
        settle: Duration::from_secs(120),
        heartbeat: super::DEFAULT_HEARTBEAT,
    }
}

/// The fault: see [`scenario`]'s description.
#[derive(Default)]
struct PoisonPanic {
    /// The Message-IDs of the panicking commands' outbound emails.
    panicking: Vec<String>,
}

#[async_trait::async_trait]
impl Fault for PoisonPanic {
    async fn prepare(&mut self, _dir: &std::path::Path) -> anyhow::Result<Setup> {
        Ok(Setup {
            env: vec![(
                "WORKER_HOST__JOBS__EMAIL_SEND__MAX_ATTEMPTS".into(),
                MAX_ATTEMPTS.to_string(),
            )],
            ..Setup::default()
        })
    }

    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let at = Instant::now();
        for _ in 0..PER_REPETITION {
            let id = run
                .direct
                .email_send(Some(json!({"x-fault-inject": "panic"})))
                .await?;
            self.panicking.push(id);
        }
        run.expected_dead_letters = Some(self.panicking.len() as u64);
        run.record_ready_after(at).await
    }

    async fn verify(&mut self, run: &mut Run) -> anyhow::Result<Vec<Check>> {
        let mut why = Vec::new();
        let dead = run
            .count_among(
                &format!(
                    "SELECT count(*) FROM dead_letters d JOIN outbound_emails o ON d.message_id = o.id::text \
                     WHERE o.message_id = ANY($1) AND d.reason = 'gave-up' AND d.attempts = {MAX_ATTEMPTS} \
                     AND d.last_error LIKE '%panicked: fault injection%'"
                ),
                &self.panicking,
            )
            .await? as u64;
        if dead != self.panicking.len() as u64 {
            why.push(format!(
                "{dead} of {} panicking commands dead-lettered `gave-up` after {MAX_ATTEMPTS} attempts with the panic's message (is the host built with --features fault-injection?)",
                self.panicking.len()
            ));
        }
        let sent = crate::mail::message_ids(&run.boxes.direct)
            .await?
            .into_iter()
            .flatten()
            .filter(|id| self.panicking.contains(id))
            .count();
        if sent > 0 {
            why.push(format!("{sent} panicking commands' mails were sent"));
        }
        Ok(why
            .into_iter()
            .map(|what| Check::new(what, false))
            .collect())
    }
}
