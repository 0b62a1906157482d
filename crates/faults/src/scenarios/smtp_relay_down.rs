//! `smtp-relay-down`: the relay refuses connections for longer than a reply's every try, then
//! is back.

use worker_testkit::FaultProxy;

use super::Scenario;
use super::relay_outage::{self, Outage, Switch};

pub fn scenario() -> Scenario {
    relay_outage::scenario(
        "smtp-relay-down",
        "The host's SMTP goes through a `FaultProxy` in front of the shared SMTP sink. At a \
         random moment of each repetition the proxy cuts its open connections and stops \
         listening (connections refused) for 30 s, longer than a reply's every try (three, \
         2 s and 5 s apart, for this scenario), then listens again. Five refused connections \
         in a row open the relay's circuit: the sender's consumers stop, what they held goes \
         back to its queue uncharged, and a sign-in probes the relay every 2 to 5 s. The \
         replies that failed before it opened are parked with a try counted, as any transient \
         failure. Nothing may be dead-lettered and every ping is answered once. \"Ready \
         again\" is from the proxy listening again.",
        || Box::new(Outage::<FaultProxy>::default()),
    )
}

#[async_trait::async_trait]
impl Switch for FaultProxy {
    async fn start(sink: std::net::SocketAddr) -> anyhow::Result<Self> {
        FaultProxy::start(sink).await
    }

    fn port(&self) -> u16 {
        FaultProxy::port(self)
    }

    /// Down: nothing new connects, and the pool's open connections die with it.
    fn out(&self) {
        self.refuse();
        self.cut();
    }

    fn back(&self) {
        self.heal();
    }
}
