//! `smtp-4xx-then-accept`: RCPT to the scenario's sender answered `451 4.3.0 try later` for a
//! while, then accepted again.

use std::time::{Duration, Instant};

use super::sink_switch::SinkSwitch;
use super::{Fault, Load, Scenario};
use crate::run::Run;

/// How long the server refuses the replies' recipient.
const REFUSAL: Duration = Duration::from_secs(12);

pub fn scenario() -> Scenario {
    Scenario {
        name: "smtp-4xx-then-accept",
        about: "At a random moment of each repetition the shared SMTP sink's failure switch \
                for the scenario's own sender (`<services dir>/smtp-fail/<sender>`, first line \
                `451 4.3.0 try later`) makes every RCPT to it, that is every reply of the host, \
                answered 451 for 12 s; then the file is removed and the address is accepted. \
                A 4xx is certain (the server has no mail), so the host retries and every ping \
                is answered exactly once. \"Ready again\" is from the switch's removal.",
        fault: Some(|| Box::new(Smtp4xxThenAccept)),
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
struct Smtp4xxThenAccept;

#[async_trait::async_trait]
impl Fault for Smtp4xxThenAccept {
    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let switch = SinkSwitch::fail(&run.boxes.sender, "451 4.3.0 try later")?;
        tokio::time::sleep(REFUSAL).await;
        let accepted = Instant::now();
        drop(switch);
        run.record_ready_after(accepted).await
    }
}
