//! `smtp-stall-after-data`: the answer to the final "." of the replies comes after the host's
//! send timeout, for a while: the mails went out, the host cannot know.

use std::time::{Duration, Instant};

use super::sink_switch::SinkSwitch;
use super::{Fault, Load, Scenario};
use crate::run::Run;

/// How late the answer comes: past the host's send timeout (`jobs.email_send.timeout`,
/// 10 s here).
const LATE_BY_SECS: u64 = 15;

/// How long the switch stays.
const STALL: Duration = Duration::from_secs(12);

pub fn scenario() -> Scenario {
    Scenario {
        name: "smtp-stall-after-data",
        about: "At a random moment of each repetition the shared SMTP sink's late-answer \
                switch for the scenario's own sender (`<services dir>/smtp-delay/<sender>`, \
                `15`) makes the sink deliver each reply at once but answer its final \".\" only \
                after 15 s, past the host's 10 s send timeout, for 12 s; then the file is \
                removed. Each such send is an unknown outcome (the row `unknown`, counted in \
                `worker_email_unknown_outcomes_total`, not retried in process; the parked \
                command's next delivery sends it again), so duplicates must stay within the \
                faults in a send's window, and no ping may be lost (the first copy was \
                delivered). The scenario fails as a harness error if no send met the stall. \
                \"Ready again\" is from the switch's removal.",
        fault: Some(|| Box::new(SmtpStallAfterData)),
        full: Load {
            repetitions: 10,
            per_repetition: 20,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 20,
        },
        rate_per_sec: 2.0,
        settle: Duration::from_secs(180),
        heartbeat: super::DEFAULT_HEARTBEAT,
    }
}

/// The fault: see [`scenario`]'s description.
struct SmtpStallAfterData;

#[async_trait::async_trait]
impl Fault for SmtpStallAfterData {
    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let switch = SinkSwitch::delay(&run.boxes.sender, LATE_BY_SECS)?;
        tokio::time::sleep(STALL).await;
        let removed = Instant::now();
        drop(switch);
        run.record_ready_after(removed).await
    }

    async fn finish(&mut self, run: &mut Run) -> anyhow::Result<()> {
        super::expect_unknown_outcomes(run, "the late answer").await
    }
}
