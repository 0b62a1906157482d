//! # worker-broker: RabbitMQ for the worker host, on lapin
//!
//! Everything that speaks AMQP lives here: the topology every consumer queue needs, a
//! publisher whose success means "routed and confirmed", the consumer runner that applies the
//! recoverability pipeline to every delivery, and the supervision that keeps a connection up
//! across broker restarts. Jobs never see lapin: they implement [`worker_core::ConsumerJob`]
//! and return a classified [`worker_core::Failure`]; this crate turns that class into a broker
//! action.
//!
//! ## The pipeline, for every delivery
//!
//! Where it sits among the host's layers (timer ticks included) is written once, in
//! ARCHITECTURE.md under "The layer order".
//!
//! ```text
//! delivery ─▶ x-attempt ok? ─no──────────────────────────────▶ dead letter "malformed"
//!                 │ yes
//!                 ▼
//!         x-schema-version ok? ─not an integer ≥ 1───────────▶ dead letter "malformed"
//!                 │      └─newer than the job reads ─────────▶ dead letter "rejected"
//!                 │ yes (missing is 1)                            (permanent, schema-too-new)
//!                 ▼
//!            body decodes? ─no───────────────────────────────▶ dead letter "malformed"
//!                 │ yes
//!                 ▼
//!         Retry (in process, per-try timeout) around the handler
//!                 │
//!   Done/Duplicate ─▶ ack
//!   Permanent      ─▶ dead letter "rejected"
//!   Transient      ─▶ attempt < max_attempts ? park in tier(attempt+1), x-attempt+1
//!                                            : dead letter "gave-up"
//!   Throttled      ─▶ same, in the first tier that waits at least retry_after (else the
//!                     longest); waits past in_process_wait are never made in memory
//!   Cancelled      ─▶ back to the queue (nack, requeue)
//!
//! A park or dead letter is acked only once its publish is confirmed; a park that fails falls
//! back to a dead letter; when both fail, the delivery goes back to the queue and the queue's
//! x-delivery-limit dead-letters it after its deliveries (x-death reason delivery_limit).
//! ```
//!
//! A parked or dead copy keeps the body, routing key, content type, message id, correlation
//! id, type, timestamp and every application header (trace context included). A dead letter
//! adds `x-dead-reason`, `x-dead-attempts`, `x-dead-error` (≤ 2 KiB), `x-dead-class`,
//! `x-dead-queue` and `x-dead-at`, and drops `x-attempt`. Parking goes through the default
//! exchange, so the original routing key travels in `x-original-routing-key`.
//!
//! ## Modules
//!
//! * [`topology`]: settings (`[broker.topology]`, `[jobs.<consumer>.queue]`), the resolved
//!   [`Topology`], [`declare`] (idempotent; a conflicting queue is a [`TopologyError::Conflict`]
//!   that names the argument and how to resolve it), and the tier arithmetic.
//! * [`publisher`]: [`Publisher`], confirmed, `mandatory`, pipelined ([`Publisher::publish_many`]);
//!   [`PublishError`] classified once into a transient or permanent [`worker_core::Failure`].
//! * [`consumer`]: [`ConsumerRunner`], its [`ConsumerSettings`] (`[jobs.<consumer>]`), the pure
//!   [`consumer::decide`] and [`consumer::attempt_of`], and the [`ConsumerEvents`] hook for
//!   metrics; underneath, [`ConsumeLoop`], the one consume loop (the runner's, and the
//!   dead-letter archiver's): it hands each [`Delivery`] to a handler and settles it as the
//!   handler answers ([`Settle`]). Acks of contiguous completions are coalesced into one
//!   `multiple` ack.
//! * [`message`]: [`Properties`], [`Headers`] and [`Delivery`], this crate's own types for a
//!   message, converted to and from lapin's only here: no other crate needs lapin.
//! * [`parked`]: what waits in a queue's retry tiers, counted, and sent back to its work
//!   queue now ([`parked::send_parked_now`]: confirmed before the tier's ack, attempt kept).
//! * [`section`]: [`ConsumerSection`], what a consumer job's settings section gives the host
//!   (its queue's defaults, its `queue`, the runner's settings), and [`validate_runner`].
//! * [`connection`]: [`ConnectionSettings`] (`[broker.connection]`, password redacted),
//!   [`Supervisor`] (reconnects with capped backoff, redeclares, hands out [`Session`]s and a
//!   [`BrokerStatus`] through `tokio::sync::watch` for `/readyz`).
//! * [`address`]: [`BrokerAddress`] (`host:port`) and the [`Rotation`] over a cluster's
//!   addresses: each reconnect starts after the node that failed or went away.
//! * [`trace`]: W3C `traceparent`/`tracestate` in AMQP headers.
//!
//! ## What the host calls
//!
//! ```no_run
//! # async fn host() -> Result<(), Box<dyn std::error::Error>> {
//! # #[derive(Clone)] struct SendEmail;
//! # impl worker_core::ConsumerJob for SendEmail {
//! #     type Input = serde_json::Value;
//! #     fn name(&self) -> &str { "email.send" }
//! #     async fn handle(&self, _: &worker_core::WorkContext, _: &serde_json::Value)
//! #         -> Result<worker_core::Handled, worker_core::Failure> { Ok(worker_core::Handled::Done) }
//! # }
//! use tokio_util::sync::CancellationToken;
//! use worker_broker::*;
//!
//! let topo_settings = TopologySettings::default();
//! let email_queue = QueueTopology::from_settings(
//!     &QueueSettings::default(),
//!     QueueDefaults::command("email.send", &topo_settings),
//! )?;
//! let topology = Topology::from_settings(&topo_settings, [email_queue.clone()])?;
//!
//! let root = CancellationToken::new();
//! let supervisor = Supervisor::new(ConnectionSettings::default(), topology);
//! let tracker = tokio_util::task::TaskTracker::new();
//! tracker.spawn(supervisor.clone().run(root.clone())); // connects, declares, reconnects
//!
//! let runner = ConsumerRunner::new(SendEmail, email_queue, ConsumerSettings::default());
//! let (sup, token) = (supervisor.clone(), root.clone());
//! tracker.spawn(async move { runner.run(&sup, token).await }); // until shutdown
//!
//! let publisher = supervisor.publisher(PublisherSettings::default());
//! publisher.publish(&Outgoing::json("commands", "email.send", &serde_json::json!({}))?).await?;
//!
//! let ready = supervisor.status().borrow().is_ready(); // /readyz
//! root.cancel();
//! tracker.close();
//! tracker.wait().await;
//! # let _ = ready; Ok(()) }
//! ```
//!
//! ## Invariants
//!
//! * **Nothing is acked before its outcome is safe**: the handler succeeded, or its park or
//!   dead letter was confirmed by the broker.
//! * **lapin's auto-recovery stays off**; only the [`Supervisor`] reconnects, and consumers
//!   and publishers always use its current [`Session`]. A reconnect never waits for a node
//!   that just failed while another address is left to try.
//! * **No `Failure` is inspected twice**: [`consumer::decide`] maps a class to an action in
//!   one place, [`PublishError::to_failure`] classifies publish errors in one place.
//! * **A throttle never holds a delivery**: in-process waits have a budget per delivery
//!   ([`ConsumerSettings::in_process_wait`], well under RabbitMQ's 30 min consumer timeout);
//!   a longer `retry_after` parks the message at once.
//! * **Shutdown finishes what was delivered**: consumers `basic.cancel` first, then work
//!   through every delivery they hold (prefetched ones too), acking as they go, until the
//!   settle deadline; only what is left then is cancelled and returned to the queue (each
//!   return counts against the quorum delivery limit). The supervisor keeps the connection
//!   up until they let go.
//! * **A lost channel does not cut a handler short**: it finishes within its timeout and
//!   records its outcome; its settle is dropped and the broker's redelivery meets the job's
//!   guard. A park whose confirm is lost with the channel may leave two copies (the parked one
//!   and the requeued delivery): at-least-once, never lost, and for a guarded job the second
//!   copy is a duplicate once either succeeds; an unguarded job sees it twice.

pub mod address;
pub mod connection;
pub mod consumer;
pub mod message;
pub mod parked;
pub mod publisher;
pub mod section;
pub mod topology;
pub mod trace;

pub use address::{AddressError, BrokerAddress, Rotation};
pub use connection::{
    BrokerStatus, ConnectError, ConnectionSettings, DEFAULT_FRAME_MAX, FRAME_MAX_MIN, Hold,
    LinkState, Session, Supervisor, next_session,
};
pub use consumer::{
    ConsumeLoop, ConsumeSettings, ConsumerEvents, ConsumerRunner, ConsumerSettings, DeadReason,
    DeliveryReport, Gate, Outcome, Scope, SessionEnd, Settle,
};
pub use message::{Delivery, HeaderValue, Headers, Properties};
pub use publisher::{Outgoing, PublishError, Publisher, PublisherSettings, headers_from_json};
pub use section::{ConsumerSection, validate_runner};
pub use topology::{
    BindingSettings, DeclareConflict, LeaderLocator, QueueDefaults, QueueSettings, QueueTopology,
    QuorumPlacement, RetryTier, Topology, TopologyError, TopologySettings, declare,
};
