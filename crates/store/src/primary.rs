//! A database of several members (a primary and its standbys): the pool connects to the one
//! that accepts writes, as libpq's `target_session_attrs=read-write` does, and follows it when
//! another member is promoted.
//!
//! sqlx's pool takes one host. With a list of [`Member`]s, [`crate::connect`]:
//! 1. asks each member in order whether it takes writes (a session of its own, `SELECT
//!    pg_is_in_recovery() OR current_setting('transaction_read_only')::bool`) and opens the
//!    pool on the first that does;
//! 2. refuses every new connection that lands on a member that no longer takes writes
//!    (sqlx's `after_connect`: sqlx closes it and tries again, and the follower is told);
//! 3. runs a follower beside the pool: every [`CHECK_INTERVAL`] (at once when a connection
//!    was refused or a ping failed) it asks the current member again on a session of its
//!    own; when that member is gone or is a standby, it asks every member in order and points
//!    the pool at the first that takes writes (`Pool::set_connect_options`);
//! 4. closes, before handing it out, every pooled connection opened before that switch
//!    (sqlx's `before_acquire`, by the connection's age), so that every connection the pool
//!    hands out after a switch is to the new primary.
//!
//! While no member takes writes (a crash before a promotion), the pool's connections fail
//! (transient errors, retried) and [`PrimaryWatch`] says "no primary", with each member's
//! answer; the follower asks every [`RETRY_INTERVAL`] until one does. The follower ends when
//! the pool is closed (or its runtime stops).

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use worker_core::host_port::{self, Malformed};

/// How often the follower asks the current primary whether it still takes writes.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// How often the follower asks every member while none takes writes.
pub const RETRY_INTERVAL: Duration = Duration::from_millis(250);

/// How long one member may take to connect and answer whether it takes writes.
pub const MEMBER_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether the session's server takes writes: not a standby, and not read-only by default
/// (what libpq's `target_session_attrs=read-write` checks).
const TAKES_WRITES: &str =
    "SELECT NOT (pg_is_in_recovery() OR current_setting('transaction_read_only')::bool)";

/// One member of the database: a host name or IP address and a port.
///
/// Written `host:port`, an IPv6 address in brackets (`[::1]:5432`). The host is kept as
/// written: with `verify-full` the server's certificate must name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Member {
    /// A host name or IP address (an IPv6 one without brackets).
    pub host: String,
    pub port: u16,
}

impl Member {
    /// The member at `host` and `port`.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        Self {
            host: host.into(),
            port,
        }
    }

    /// `base` (credentials, database, TLS, session settings) pointed at this member.
    pub fn connect_options(&self, base: &PgConnectOptions) -> PgConnectOptions {
        base.clone().host(&self.host).port(self.port)
    }
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        host_port::shown(&self.host, self.port).fmt(f)
    }
}

/// Why a text is not a member's `host:port`. Each variant quotes the text: an address is not
/// a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemberError {
    #[error("expected `host:port` (an IPv6 address as `[::1]:5432`), found `{0}`")]
    NotHostPort(String),
    #[error("expected a host before the port, found `{0}`")]
    EmptyHost(String),
    #[error("expected a port number from 1 to 65535 after the host, found `{0}`")]
    BadPort(String),
}

impl FromStr for Member {
    type Err = MemberError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match host_port::split(text) {
            Ok((host, port)) => Ok(Self::new(host, port)),
            Err(Malformed::NotHostPort) => Err(MemberError::NotHostPort(text.into())),
            Err(Malformed::EmptyHost) => Err(MemberError::EmptyHost(text.into())),
            Err(Malformed::BadPort) => Err(MemberError::BadPort(text.into())),
        }
    }
}

/// What a member answered when asked whether it takes writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "role", content = "error")]
pub enum MemberRole {
    /// It takes writes.
    Primary,
    /// It answered, read-only (in recovery, or `default_transaction_read_only`).
    Standby,
    /// It did not answer (refused, timed out, failed the login): why.
    Unreachable(String),
}

impl fmt::Display for MemberRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Primary => f.write_str("the primary"),
            Self::Standby => f.write_str("a standby (read-only)"),
            Self::Unreachable(why) => write!(f, "unreachable: {why}"),
        }
    }
}

/// Each member's answer, in the list's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberState {
    /// `host:port`.
    pub member: String,
    #[serde(flatten)]
    pub role: MemberRole,
}

/// What the follower knows: `/status` shows it, readiness asks it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PrimaryStatus {
    /// Every member, `host:port`, in the list's order.
    pub members: Vec<String>,
    /// The member the pool connects to, while it takes writes; `None`: no primary.
    pub primary: Option<String>,
    /// Since when the primary is `primary` (or since when there has been none).
    pub since: DateTime<Utc>,
    /// Times the pool moved to another member since it opened.
    pub switches: u64,
    /// Each member's answer the last time all were asked (at the start, and at each search
    /// for a primary).
    pub last_survey: Vec<MemberState>,
}

impl PrimaryStatus {
    /// Ready while a member takes writes; else "no primary" with each member's answer.
    pub fn readiness(&self) -> Result<(), String> {
        match self.primary {
            Some(_) => Ok(()),
            None => Err(format!("no primary: {}", describe(&self.last_survey))),
        }
    }
}

/// Each member's answer, in one line (`db-a:5432: a standby (read-only); db-b:5432: …`).
pub fn describe(survey: &[MemberState]) -> String {
    survey
        .iter()
        .map(|state| format!("{}: {}", state.member, state.role))
        .collect::<Vec<_>>()
        .join("; ")
}

/// A view of the pool's follower, cheap to clone: which member is primary.
#[derive(Debug, Clone)]
pub struct PrimaryWatch(watch::Receiver<PrimaryStatus>);

impl PrimaryWatch {
    /// The follower's latest knowledge.
    pub fn status(&self) -> PrimaryStatus {
        self.0.borrow().clone()
    }

    /// See [`PrimaryStatus::readiness`].
    pub fn readiness(&self) -> Result<(), String> {
        self.0.borrow().readiness()
    }

    /// Waits until the follower's knowledge changes (for tests and scenarios).
    pub async fn changed(&mut self) -> Result<(), watch::error::RecvError> {
        self.0.changed().await
    }
}

/// Asks `member` whether it takes writes, within [`MEMBER_TIMEOUT`].
pub async fn ask(base: &PgConnectOptions, member: &Member) -> MemberRole {
    let options = member.connect_options(base);
    let asked = async {
        let mut session = options.connect().await?;
        let writes = takes_writes(&mut session).await;
        let _ = session.close().await;
        writes
    };
    match tokio::time::timeout(MEMBER_TIMEOUT, asked).await {
        Ok(Ok(true)) => MemberRole::Primary,
        Ok(Ok(false)) => MemberRole::Standby,
        Ok(Err(err)) => MemberRole::Unreachable(worker_core::error_chain(&err)),
        Err(_) => {
            MemberRole::Unreachable(format!("no answer within {}s", MEMBER_TIMEOUT.as_secs()))
        }
    }
}

/// Asks every member in order, stopping at the first that takes writes; returns its index
/// and every answer so far (the members after it are not asked).
pub async fn survey(
    base: &PgConnectOptions,
    members: &[Member],
) -> (Option<usize>, Vec<MemberState>) {
    let mut answers = Vec::with_capacity(members.len());
    for (index, member) in members.iter().enumerate() {
        let role = ask(base, member).await;
        let primary = role == MemberRole::Primary;
        answers.push(MemberState {
            member: member.to_string(),
            role,
        });
        if primary {
            return (Some(index), answers);
        }
    }
    (None, answers)
}

/// Asks every member at once (for an operator's look: `config check`), each within
/// [`MEMBER_TIMEOUT`]; the answers in the list's order.
pub async fn ask_each(base: &PgConnectOptions, members: &[Member]) -> Vec<MemberState> {
    let mut asking = tokio::task::JoinSet::new();
    for (index, member) in members.iter().enumerate() {
        let (base, member) = (base.clone(), member.clone());
        asking.spawn(async move { (index, ask(&base, &member).await) });
    }
    let mut roles: Vec<Option<MemberRole>> = vec![None; members.len()];
    while let Some(joined) = asking.join_next().await {
        if let Ok((index, role)) = joined {
            roles[index] = Some(role);
        }
    }
    members
        .iter()
        .zip(roles)
        .map(|(member, role)| MemberState {
            member: member.to_string(),
            role: role.unwrap_or_else(|| MemberRole::Unreachable("the question failed".into())),
        })
        .collect()
}

/// Keeps `own`, a pool of its own beside `main` (a listener's, which must not take one of
/// `main`'s connections), pointed where `main` points: when `main`'s follower moves it to a
/// new primary, `own`'s next connections go there too, under `own`'s application name. A
/// task that looks every [`CHECK_INTERVAL`], without a query; it ends when either pool is
/// closed, so `own` must be closed when done with (a listener made anew on each reconnect
/// needs none of this: it takes `main`'s options as they are then). Without a list of
/// members `main` never moves, and this costs a timer.
pub fn keep_in_step(main: &PgPool, own: &PgPool) {
    let (main, own) = (main.clone(), own.clone());
    tokio::spawn(async move {
        let main_closed = main.close_event();
        let own_closed = own.close_event();
        tokio::pin!(main_closed, own_closed);
        let mut seen = main.connect_options();
        loop {
            tokio::select! {
                () = &mut main_closed => return,
                () = &mut own_closed => return,
                () = tokio::time::sleep(CHECK_INTERVAL) => {}
            }
            let now = main.connect_options();
            if Arc::ptr_eq(&seen, &now) {
                continue;
            }
            let name = own
                .connect_options()
                .get_application_name()
                .map(str::to_string);
            let mut options = (*now).clone();
            if let Some(name) = name {
                options = options.application_name(&name);
            }
            own.set_connect_options(options);
            seen = now;
        }
    });
}

async fn takes_writes(session: &mut PgConnection) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(TAKES_WRITES).fetch_one(session).await
}

/// What the pool's hooks and its follower share.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// When the pool last moved to another member: connections older than that are closed
    /// before they are handed out.
    switched_at: Mutex<Option<Instant>>,
    /// Woken when a hook suspects the primary (a refused standby, a failed ping).
    suspect: Notify,
}

impl Shared {
    /// Whether a connection of this age was opened before the last switch.
    pub(crate) fn opened_before_switch(&self, age: Duration) -> bool {
        let switched_at = match self.switched_at.lock() {
            Ok(at) => *at,
            Err(poisoned) => *poisoned.into_inner(),
        };
        switched_at.is_some_and(|at| {
            Instant::now()
                .checked_sub(age)
                .is_none_or(|opened| opened < at)
        })
    }

    /// Tells the follower to check the primary now.
    pub(crate) fn suspect(&self) {
        self.suspect.notify_one();
    }

    fn switched(&self) {
        match self.switched_at.lock() {
            Ok(mut at) => *at = Some(Instant::now()),
            Err(poisoned) => *poisoned.into_inner() = Some(Instant::now()),
        }
    }
}

/// The `after_connect` check: a new connection to a member that takes no writes is refused
/// (sqlx closes it and tries again), and the follower is told.
pub(crate) async fn refuse_standby(
    conn: &mut PgConnection,
    shared: &Shared,
) -> Result<(), sqlx::Error> {
    if takes_writes(conn).await? {
        return Ok(());
    }
    shared.suspect();
    Err(sqlx::Error::Protocol(
        "the member this connection reached is a standby (read-only); the pool connects only to the primary".into(),
    ))
}

/// The follower's start: the members, the one found primary at the start and every answer.
pub(crate) struct Found {
    pub(crate) members: Vec<Member>,
    pub(crate) base: PgConnectOptions,
    pub(crate) primary: usize,
    pub(crate) survey: Vec<MemberState>,
}

/// Starts the follower beside `pool` (see the module's doc); it ends when the pool closes.
pub(crate) fn follow(pool: PgPool, found: Found, shared: Arc<Shared>) -> PrimaryWatch {
    let Found {
        members,
        base,
        primary,
        survey,
    } = found;
    let (sender, receiver) = watch::channel(PrimaryStatus {
        members: members.iter().map(Member::to_string).collect(),
        primary: Some(members[primary].to_string()),
        since: Utc::now(),
        switches: 0,
        last_survey: survey,
    });
    tokio::spawn(async move {
        let follower = Follower {
            pool,
            members,
            base,
            current: primary,
            session: None,
            shared,
            sender,
        };
        follower.run().await;
    });
    PrimaryWatch(receiver)
}

struct Follower {
    pool: PgPool,
    members: Vec<Member>,
    base: PgConnectOptions,
    /// The member the pool's connect options point at.
    current: usize,
    /// The follower's own session to `current`, while it answers.
    session: Option<PgConnection>,
    shared: Arc<Shared>,
    sender: watch::Sender<PrimaryStatus>,
}

impl Follower {
    async fn run(mut self) {
        let closed = self.pool.close_event();
        tokio::pin!(closed);
        loop {
            let has_primary = self.sender.borrow().primary.is_some();
            let wait = if has_primary {
                CHECK_INTERVAL
            } else {
                RETRY_INTERVAL
            };
            tokio::select! {
                () = &mut closed => return,
                () = self.shared.suspect.notified() => {}
                () = tokio::time::sleep(wait) => {}
            }
            if has_primary && self.current_still_primary().await {
                continue;
            }
            self.search().await;
        }
    }

    /// Asks the current member on the follower's own session (opened again if it failed).
    async fn current_still_primary(&mut self) -> bool {
        let options = self.members[self.current]
            .connect_options(&self.base)
            .application_name(&format!(
                "{} (primary check)",
                self.base.get_application_name().unwrap_or("worker-store")
            ));
        let asked = async {
            if self.session.is_none() {
                self.session = Some(options.connect().await?);
            }
            match self.session.as_mut() {
                Some(session) => takes_writes(session).await,
                None => Ok(false),
            }
        };
        match tokio::time::timeout(MEMBER_TIMEOUT, asked).await {
            Ok(Ok(true)) => true,
            Ok(Ok(false)) | Ok(Err(_)) | Err(_) => {
                self.session = None;
                false
            }
        }
    }

    /// Asks every member in order and points the pool at the first that takes writes.
    async fn search(&mut self) {
        let (found, answers) = survey(&self.base, &self.members).await;
        let had = self.sender.borrow().primary.clone();
        match found {
            Some(index) => {
                let member = self.members[index].to_string();
                let moved = index != self.current;
                if moved {
                    self.pool
                        .set_connect_options(self.members[index].connect_options(&self.base));
                    self.shared.switched();
                    self.current = index;
                    self.session = None;
                }
                if moved || had.is_none() {
                    tracing::warn!(primary = %member, answers = %describe(&answers), "the database's primary is {member}: the pool connects to it");
                }
                self.sender.send_modify(|status| {
                    if had.as_deref() != Some(member.as_str()) {
                        status.since = Utc::now();
                    }
                    if moved {
                        status.switches += 1;
                    }
                    status.primary = Some(member);
                    status.last_survey = answers;
                });
            }
            None => {
                if had.is_some() {
                    tracing::error!(answers = %describe(&answers), "the database has no primary: no member takes writes");
                    self.sender.send_modify(|status| {
                        status.since = Utc::now();
                        status.primary = None;
                    });
                }
                self.sender
                    .send_modify(|status| status.last_survey = answers);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_read_and_written_as_host_port() {
        for (text, host, port) in [
            ("127.0.0.1:5432", "127.0.0.1", 5432),
            ("db-a.example.com:6432", "db-a.example.com", 6432),
            (" db-b:5433 ", "db-b", 5433),
            ("[::1]:5432", "::1", 5432),
        ] {
            let member: Member = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(member, Member::new(host, port), "{text}");
            assert_eq!(member.to_string(), text.trim(), "{text}");
        }
    }

    #[test]
    fn what_is_not_host_port_is_refused_quoting_it() {
        for (text, expected) in [
            ("db-a", MemberError::NotHostPort("db-a".into())),
            ("::1:5432", MemberError::NotHostPort("::1:5432".into())),
            ("[::1]5432", MemberError::NotHostPort("[::1]5432".into())),
            (":5432", MemberError::EmptyHost(":5432".into())),
            ("db a:5432", MemberError::EmptyHost("db a:5432".into())),
            ("db-a:0", MemberError::BadPort("db-a:0".into())),
            ("db-a:65536", MemberError::BadPort("db-a:65536".into())),
            ("db-a:pg", MemberError::BadPort("db-a:pg".into())),
        ] {
            assert_eq!(text.parse::<Member>(), Err(expected), "{text}");
        }
    }

    #[test]
    fn a_member_takes_the_base_options_with_its_own_host_and_port() {
        let base = PgConnectOptions::new()
            .host("ignored")
            .port(1)
            .username("worker")
            .database("jobs");
        let options = Member::new("db-b", 6543).connect_options(&base);
        assert_eq!(
            (
                options.get_host(),
                options.get_port(),
                options.get_username()
            ),
            ("db-b", 6543, "worker")
        );
        assert_eq!(options.get_database(), Some("jobs"));
    }

    #[test]
    fn no_primary_is_not_ready_and_names_each_members_answer() {
        let status = PrimaryStatus {
            members: vec!["db-a:5432".into(), "db-b:5432".into()],
            primary: None,
            since: Utc::now(),
            switches: 0,
            last_survey: vec![
                MemberState {
                    member: "db-a:5432".into(),
                    role: MemberRole::Standby,
                },
                MemberState {
                    member: "db-b:5432".into(),
                    role: MemberRole::Unreachable("connection refused".into()),
                },
            ],
        };
        assert_eq!(
            status.readiness(),
            Err("no primary: db-a:5432: a standby (read-only); db-b:5432: unreachable: connection refused".into())
        );
        let ready = PrimaryStatus {
            primary: Some("db-b:5432".into()),
            ..status
        };
        assert_eq!(ready.readiness(), Ok(()));
    }

    #[test]
    fn connections_opened_before_a_switch_are_told_apart_by_their_age() {
        let shared = Shared::default();
        assert!(!shared.opened_before_switch(Duration::from_secs(3600)));
        shared.switched();
        assert!(shared.opened_before_switch(Duration::from_secs(5)));
        assert!(!shared.opened_before_switch(Duration::ZERO));
    }
}
