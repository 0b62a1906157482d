//! The sending rate of the SMTP account (`[smtp.rate]`): messages a minute, messages a day and
//! recipients a day, counted in PostgreSQL (`smtp_send_rate`, `table.rs`) so that every replica
//! shares one budget: ten replicas together stay under 30 a minute.
//!
//! Why the database and not the broker: a send's turn must be decided against every other
//! replica's sends at that moment, which a row lock gives in one short transaction; the broker
//! has no shared counter (a queue of tokens refilled by a timer would need a leader, and would
//! lose its count with the queue). The database also keeps the day's count across restarts and
//! lets `/status` read it.
//!
//! A mail over the rate waits for its turn: a wait of at most [`WAIT_IN_PROCESS`] in the
//! handler, a longer one parked for its wait (`Failure::Unavailable` with a wait, charged no
//! try). A provider's own quota answer ([`quota`]) opens the relay's circuit until the window
//! rolls over.

pub mod quota;
mod table;
pub mod windows;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use worker_core::{Failure, Problems, SettingError};
use worker_mail_auth::SendingLimits;

use quota::QuotaWindow;
use windows::Windows;
pub use windows::{Limits, Turn, Usage};

/// The longest wait for a turn spent in the handler (holding its claim); a longer one parks
/// the message for its wait instead.
pub const WAIT_IN_PROCESS: Duration = Duration::from_secs(2);

/// How long a quota answer keeps the relay's circuit open when no send of ours in the window
/// says when it rolls over (another client of the same mailbox used it up): a minute's window,
/// or an hour of a day's.
const MINUTE_FALLBACK: Duration = Duration::from_secs(60);
const DAY_FALLBACK: Duration = Duration::from_secs(60 * 60);

/// `[smtp.rate]`: how much the SMTP account may send, all replicas together. A key left unset
/// takes the preset of `smtp.oauth`'s provider (Microsoft 365: 30 messages a minute and 10,000
/// recipients a day; Google: 2,000 messages a day), else sets no limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateSettings {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub messages_per_minute: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub messages_per_day: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recipients_per_day: Option<u32>,
}

impl RateSettings {
    /// The limits in force: each key as given, else the provider's.
    pub fn limits(&self, preset: SendingLimits) -> Limits {
        Limits {
            messages_per_minute: self.messages_per_minute.or(preset.messages_per_minute),
            messages_per_day: self.messages_per_day.or(preset.messages_per_day),
            recipients_per_day: self.recipients_per_day.or(preset.recipients_per_day),
        }
    }

    /// A limit of zero would never send: leave it unset for no limit.
    pub fn problems(&self) -> Vec<SettingError> {
        let mut problems = Problems::new();
        for (key, value) in [
            ("messages_per_minute", self.messages_per_minute),
            ("messages_per_day", self.messages_per_day),
            ("recipients_per_day", self.recipients_per_day),
        ] {
            if value == Some(0) {
                problems.add(key, "0 would never send: leave it unset for no limit");
            }
        }
        problems.into_vec()
    }
}

/// The rate as `/status` and the job's page show it, at the moment of the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RateView {
    /// `host:port/username`: the account the budget is kept for.
    pub account: String,
    pub limits: Limits,
    /// The limits in words (`30 messages a minute, 10000 recipients a day`).
    pub summary: String,
    /// What the windows held at the last send of this replica, aged to now (other replicas'
    /// sends since are not in it).
    pub used: Usage,
    /// Seconds until a one-recipient mail may go (0: now).
    pub next_send_in_secs: u64,
    /// When this replica last read the windows; none before its first send.
    pub as_of: Option<DateTime<Utc>>,
}

/// The windows as a take last read them, and the database's time then.
type LastRead = (Windows, DateTime<Utc>);

/// One sender's handle on its account's budget. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct SendRate {
    pool: PgPool,
    account: String,
    limits: Limits,
    /// The windows as last read, with the database's time then.
    last: Arc<Mutex<Option<LastRead>>>,
}

impl SendRate {
    pub(crate) fn new(pool: PgPool, account: String, limits: Limits) -> Self {
        Self {
            pool,
            account,
            limits,
            last: Arc::default(),
        }
    }

    /// The turn of a mail to `recipients`: now (counted), or the wait and the limit that holds
    /// it back.
    pub(crate) async fn take(&self, recipients: u32) -> Result<Turn, Failure> {
        let (turn, windows, now) =
            table::take(&self.pool, &self.account, &self.limits, recipients).await?;
        self.keep(windows, now);
        Ok(turn)
    }

    /// Waits for the turn of a mail to `recipients` up to [`WAIT_IN_PROCESS`]; a longer wait is
    /// the relay's `Unavailable` with that wait, which parks the message charged no try.
    pub(crate) async fn wait_for_turn(&self, recipients: u32) -> Result<(), Failure> {
        let mut waited = Duration::ZERO;
        loop {
            match self.take(recipients).await? {
                Turn::Now => return Ok(()),
                Turn::After { wait, .. } if waited + wait <= WAIT_IN_PROCESS => {
                    tokio::time::sleep(wait).await;
                    waited += wait;
                }
                Turn::After { wait, limit } => {
                    tracing::info!(wait = %humantime::format_duration(round(wait)), limit, "over the sending rate: the mail waits for its turn, charged no try");
                    return Err(Failure::unavailable(
                        crate::relay::RELAY,
                        format!("over the sending rate: {limit}"),
                        Some(wait.max(Duration::from_secs(1))),
                    ));
                }
            }
        }
    }

    /// When `window` next lets a send out after a quota answer: when our oldest send in it
    /// ages out, else [`fallback_until`].
    pub(crate) async fn rolls_over(&self, window: QuotaWindow) -> DateTime<Utc> {
        let day = window == QuotaWindow::Day;
        let (windows, now) = match table::read(&self.pool, &self.account).await {
            Ok(read) => read,
            Err(err) => {
                tracing::warn!(error = %err, "could not read the sending rate's windows");
                (Windows::default(), Utc::now())
            }
        };
        windows
            .rolls_over(day, now)
            .unwrap_or_else(|| fallback_until(window, now))
    }

    /// The rate as shown (see [`RateView`]).
    pub(crate) fn view(&self) -> RateView {
        let last = self.last.lock().ok().and_then(|last| last.clone());
        let now = Utc::now();
        let (windows, as_of) = match last {
            Some((windows, at)) => (windows, Some(at)),
            None => (Windows::default(), None),
        };
        let next = match windows.turn(&self.limits, 1, now) {
            Turn::Now => Duration::ZERO,
            Turn::After { wait, .. } => wait,
        };
        RateView {
            account: self.account.clone(),
            limits: self.limits,
            summary: self.limits.describe(),
            used: windows.usage(now),
            next_send_in_secs: next.as_secs(),
            as_of,
        }
    }

    fn keep(&self, windows: Windows, now: DateTime<Utc>) {
        if let Ok(mut last) = self.last.lock() {
            *last = Some((windows, now));
        }
    }
}

/// When a quota answer's `window` is taken to roll over when no send of ours in it says: a
/// minute on, or an hour on for a day's window (the provider's window is its own; the hour
/// bounds how long mail waits on a guess).
pub(crate) fn fallback_until(window: QuotaWindow, now: DateTime<Utc>) -> DateTime<Utc> {
    let wait = match window {
        QuotaWindow::Minute => MINUTE_FALLBACK,
        QuotaWindow::Day => DAY_FALLBACK,
    };
    now + TimeDelta::from_std(wait).unwrap_or(TimeDelta::MAX)
}

fn round(wait: Duration) -> Duration {
    Duration::from_secs(wait.as_secs().max(1))
}
