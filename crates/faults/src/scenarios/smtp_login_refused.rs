//! `smtp-login-refused`: the relay refuses every sign-in (`535 5.7.8`) for longer than a
//! reply's every try, then takes them again.

use worker_testkit::SignInGate;

use super::Scenario;
use super::relay_outage::{self, Outage, Switch};
use crate::oracle::Check;

pub fn scenario() -> Scenario {
    relay_outage::scenario(
        "smtp-login-refused",
        "The host signs in to its relay through a `SignInGate` in front of the shared SMTP \
         sink (it offers AUTH and passes the rest through). At a random moment of each \
         repetition the gate answers every AUTH `535 5.7.8 Authentication credentials \
         invalid` for 30 s, longer than a reply's every try (three, 2 s and 5 s apart, for \
         this scenario), then takes sign-ins again. The first refusal opens the relay's \
         circuit at once: the sender's consumers stop on every replica, the reply in hand \
         goes back to its queue uncharged, and a sign-in probes the relay every 2 to 5 s. \
         Nothing may be dead-lettered and every ping is answered once. \"Ready again\" is \
         from the gate taking sign-ins again.",
        || Box::new(Outage::<SignInGate>::default()),
    )
}

#[async_trait::async_trait]
impl Switch for SignInGate {
    async fn start(sink: std::net::SocketAddr) -> anyhow::Result<Self> {
        SignInGate::start(sink).await
    }

    fn port(&self) -> u16 {
        SignInGate::port(self)
    }

    fn env(&self) -> Vec<(String, String)> {
        vec![
            ("WORKER_HOST__SMTP__USERNAME".into(), "faults".into()),
            ("WORKER_HOST__SMTP__PASSWORD".into(), "secret".into()),
        ]
    }

    fn out(&self) {
        self.refuse();
    }

    fn back(&self) {
        self.accept();
    }

    fn checks(&self) -> Vec<Check> {
        let refused = self.refused();
        vec![Check::new(
            format!("sign-ins refused by the relay: {refused} (must be at least 1)"),
            refused >= 1,
        )]
    }
}
