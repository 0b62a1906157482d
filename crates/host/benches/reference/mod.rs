//! The reference loop: the mail loop written with the bare clients, as the yardstick the host
//! is measured against (issue 41, item 4). It runs as a process of its own (the bench's own
//! executable, started with `--reference-loop`), so that its CPU is read apart from the load
//! generator's.
//!
//! What it shares with the host, so that the comparison is of the wiring and not of the work:
//! - the schema, the topology (declared by `worker-host topology declare`: the same quorum
//!   queues, exchanges and bindings) and the demo automation;
//! - the statements and guards: the poller's batch statement (`record_batch`: the UIDVALIDITY
//!   guard, the existence and identity look-ups, the rows and the outbox rows in one
//!   statement), the store's outbox drain (`begin_batch`, `claim`), and the three consumers'
//!   own handlers (`ConsumerJob::handle`: the trigger's one statement, the action executor's
//!   guarded transaction, the sender's claim, its SMTP pool (lettre) and its record);
//! - publish-then-ack: every consumer's effect and its outbox row commit before the delivery is
//!   acked, and the drain deletes a row only once its publish is confirmed.
//!
//! What it leaves out, by the definition of the yardstick: no tracing subscriber (the
//! handlers' own `#[instrument]` spans are inert without one), no metrics, no leases, no busy
//! guards, no retry tiers, no attempt log, no history, no publications rows (the story's), no
//! circuits, no pauses, no admin endpoints. Its IMAP side holds one session, asks the server to
//! look every 150 ms with a `NOOP`, 75 ms after one that found mail (the host's default
//! recheck on loopback and its rule; Dovecot holds its IDLE notices back by 500 ms), and
//! fetches what is new on that same session.
//!
//! With `REF_STATEMENT_LOG=1` it logs sqlx's statements to stderr in each hop's span, named as
//! the host names them, so that `throughput/hops.rs` counts both loops alike; only the counted
//! run sets it.

mod consume;
mod drain;
mod poll;

use std::time::Duration;

use sqlx::postgres::PgPoolOptions;

/// The queues of the loop and the concurrency of each consumer (the host's defaults:
/// `prefetch = 50`, `concurrency = 8`).
pub const PREFETCH: u16 = 50;
pub const CONCURRENCY: usize = 8;

/// What the reference process is told by the bench, through its environment.
struct Config {
    database_url: String,
    amqp_url: String,
    imap_addr: String,
    account: String,
}

fn config() -> Config {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    Config {
        database_url: var("REF_DATABASE_URL"),
        amqp_url: var("REF_AMQP_URL"),
        imap_addr: var("REF_IMAP_ADDR"),
        account: var("REF_ACCOUNT"),
    }
}

/// The reference process's `main`: runs the loop until SIGTERM.
pub fn main() {
    if std::env::var_os("REF_STATEMENT_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter("off,sqlx::query=debug,reference_loop=info")
            .with_ansi(false)
            .with_writer(std::io::stderr)
            .init();
    }
    // Two workers, as many as the machine's cores: the host's runtime has as many.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(run(config()));
}

async fn run(config: Config) {
    // The bare pool: no ping before each acquire (sqlx's default pings every one).
    let pool = PgPoolOptions::new()
        .max_connections(32)
        .test_before_acquire(false)
        .connect(&config.database_url)
        .await
        .expect("connecting to PostgreSQL");
    let broker =
        lapin::Connection::connect(&config.amqp_url, lapin::ConnectionProperties::default())
            .await
            .expect("connecting to RabbitMQ");

    let trigger = job_automation_trigger::AutomationTrigger::new(pool.clone(), "commands");
    let smtp = job_email_send::SmtpSettings::default();
    let executor = job_automation_action::ActionExecutor::from_settings(
        pool.clone(),
        "commands",
        &job_automation_action::AutomationActionSettings::default(),
    )
    .expect("the action executor")
    .with_own_addresses([smtp.from.as_str()]);
    let sender = job_email_send::EmailSender::from_settings(
        pool.clone(),
        &smtp,
        &smtp.from,
        &job_email_send::EmailSendSettings::default(),
        &worker_mail_auth::TokenSources::default(),
    )
    .expect("the email sender");

    // A channel each, as the host has one per consumer and one for publishing.
    let mut channels = Vec::new();
    for _ in 0..4 {
        channels.push(broker.create_channel().await.expect("a channel"));
    }
    let [trigger_channel, action_channel, send_channel, drain_channel] =
        <[lapin::Channel; 4]>::try_from(channels).expect("four channels");
    let consumers = [
        tokio::spawn(consume::run(
            trigger_channel,
            worker_messages::queues::AUTOMATION_TRIGGER,
            trigger,
        )),
        tokio::spawn(consume::run(
            action_channel,
            worker_messages::queues::AUTOMATION_ACTION,
            executor,
        )),
        tokio::spawn(consume::run(
            send_channel,
            worker_messages::queues::EMAIL_SEND,
            sender,
        )),
    ];
    let drain = tokio::spawn(drain::run(pool.clone(), drain_channel));
    let poller = poll::Poller::start(&pool, &config.imap_addr, &config.account)
        .await
        .expect("the IMAP session");
    let polling = tokio::spawn(poller.run(pool.clone(), Duration::from_millis(150)));
    // The bench waits for this line before it sends anything.
    println!("ready");

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        ended = polling => eprintln!("the poller ended: {ended:?}"),
        ended = drain => eprintln!("the drain ended: {ended:?}"),
    }
    for consumer in consumers {
        consumer.abort();
    }
    let _ = broker.close(200, "done".into()).await;
    pool.close().await;
}
