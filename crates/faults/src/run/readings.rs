//! The oracle's readings from outside: the mailboxes, the queues (management API) and the
//! scenario's database; waiting until they settle, and the final count.

use std::time::{Duration, Instant};

use anyhow::Context;

use super::{Run, STOP_WAIT};
use crate::host::HostProcess;
use crate::mail;
use crate::oracle::{self, Figures};

/// How long the end state must hold before it is counted.
const QUIET: Duration = Duration::from_secs(7);

impl Run {
    /// Waits, at most `bound`, until the sender has a mail for every ping, the direct mailbox
    /// one for every direct command, and the work queues, the dead queues and the outbox are
    /// empty, and stay so for [`QUIET`] (longer than the management API's 5 s statistics
    /// interval, whose queue depths lag; and time for a late duplicate).
    pub async fn settle(&self, pings: usize, bound: Duration) {
        let deadline = Instant::now() + bound;
        let mut clean_since: Option<Instant> = None;
        loop {
            let replies = mail::inbox_count(&self.boxes.sender).await.unwrap_or(0);
            let direct = mail::inbox_count(&self.boxes.direct).await.unwrap_or(0);
            let (queues, dead) = self
                .queues()
                .await
                .map(|q| (q.0, q.1))
                .unwrap_or((u64::MAX, u64::MAX));
            let outbox = self.outbox_left().await.unwrap_or(i64::MAX);
            if replies >= pings
                && direct >= self.direct_expected.len()
                && queues == 0
                && dead == 0
                && outbox == 0
            {
                let since = *clean_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= QUIET {
                    return;
                }
            } else {
                clean_since = None;
            }
            if Instant::now() > deadline {
                eprintln!(
                    "faults: not settled within {bound:?}: {replies}/{pings} replies, {direct}/{} direct mails, {queues} in the work queues, {dead} in the dead queues, {outbox} in the outbox",
                    self.direct_expected.len()
                );
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// (messages in the work queues and their retry tiers, messages in the dead queues, the
    /// work queues that hold any, as `name: n`).
    pub async fn queues(&self) -> anyhow::Result<(u64, u64, Vec<String>)> {
        let list = self
            .vhost
            .api(reqwest::Method::GET, "queues/{vhost}", None)
            .await?;
        let mut work = 0;
        let mut dead = 0;
        let mut busy = Vec::new();
        for queue in list.as_array().context("queues: not a list")? {
            let name = queue["name"].as_str().unwrap_or_default();
            let messages = queue["messages"].as_u64().unwrap_or(0);
            if name.ends_with(".dead") {
                dead += messages;
            } else {
                work += messages;
                if messages > 0 {
                    busy.push(format!("{name}: {messages}"));
                }
            }
        }
        Ok((work, dead, busy))
    }

    /// Outbox rows not yet published (pending or failed).
    pub async fn outbox_left(&self) -> anyhow::Result<i64> {
        self.scalar("SELECT count(*) FROM outbox WHERE status IN ('pending', 'failed')")
            .await
    }

    async fn scalar(&self, sql: &str) -> anyhow::Result<i64> {
        sqlx::query_scalar(sql)
            .fetch_one(&self.db.pool)
            .await
            .with_context(|| format!("running {sql}"))
    }

    /// Groups of rows that must be one and are more.
    pub async fn duplicate_db_effects(&self) -> anyhow::Result<u64> {
        let mut total = 0;
        for sql in [
            // A mail seen again under another UID (a new UIDVALIDITY, moved out and back) gets
            // a row of its own that names the first (`duplicate_of`) and announces nothing.
            "SELECT count(*) FROM (SELECT 1 FROM inbound_emails WHERE message_id IS NOT NULL \
             AND duplicate_of IS NULL \
             GROUP BY account, mailbox, message_id HAVING count(*) > 1) g",
            "SELECT count(*) FROM (SELECT 1 FROM action_executions \
             GROUP BY event_id, automation_id, action_index HAVING count(*) > 1) g",
            "SELECT count(*) FROM (SELECT 1 FROM inbound_emails i \
             JOIN action_executions a ON a.event_id = i.event_id \
             GROUP BY i.account, i.message_id HAVING count(*) > 1) g",
            "SELECT count(*) FROM (SELECT 1 FROM outbound_emails WHERE action_execution_id IS NOT NULL \
             GROUP BY action_execution_id HAVING count(*) > 1) g",
        ] {
            total += self.scalar(sql).await? as u64;
        }
        Ok(total)
    }

    /// `dead_letters` rows beyond the first for one message: per (queue, message id), or per
    /// (queue, body) where there is no message id. Outbox rows are keyed by their row id.
    pub async fn duplicate_dead_letters(&self) -> anyhow::Result<u64> {
        let extra = self
            .scalar(
                "SELECT coalesce(sum(n - 1), 0)::bigint FROM (SELECT count(*) AS n FROM dead_letters \
                 WHERE source <> 'outbox' \
                 GROUP BY queue, coalesce(message_id, encode(sha256(body), 'hex')) \
                 HAVING count(*) > 1) g",
            )
            .await?;
        Ok(extra as u64)
    }

    /// A scalar query on the scenario's database (for a fault's own checks).
    pub async fn query_scalar(&self, sql: &str) -> anyhow::Result<i64> {
        self.scalar(sql).await
    }

    /// A count whose query takes the scenario's own ids as `$1` (a `text[]`, bound, not
    /// spliced into the text).
    pub async fn count_among(&self, sql: &str, ids: &[String]) -> anyhow::Result<i64> {
        sqlx::query_scalar(sql)
            .bind(ids)
            .fetch_one(&self.db.pool)
            .await
            .with_context(|| format!("running {sql}"))
    }

    /// The oracle's readings, into `figures`; then the host is stopped with SIGTERM.
    pub async fn count(&mut self, pings: &[String], figures: &mut Figures) -> anyhow::Result<()> {
        let replies = mail::replies(&self.boxes.sender).await?;
        let matched = oracle::count_replies(pings, &replies);
        let direct_mails = mail::message_ids(&self.boxes.direct).await?;
        let direct = oracle::count_replies(&self.direct_expected, &direct_mails);
        figures.direct_commands = self.direct_expected.len() as u64;
        figures.messages = pings.len() as u64 + figures.direct_commands;
        figures.lost = matched.lost + direct.lost;
        figures.duplicate_mails = matched.duplicates + direct.duplicates;
        figures.stray_mails = matched.strays + direct.strays;
        figures.duplicate_db_effects = self.duplicate_db_effects().await?;
        let (work, dead, busy) = self.queues().await?;
        if !busy.is_empty() {
            eprintln!("faults: left in the work queues: {}", busy.join(", "));
        }
        figures.left_in_queues = work;
        figures.left_in_outbox = self.outbox_left().await? as u64;
        figures.dead_letters =
            dead + self.scalar("SELECT count(*) FROM dead_letters").await? as u64;
        figures.left_in_dead_queues = dead;
        figures.duplicate_dead_letters = self.duplicate_dead_letters().await?;
        figures.expected_dead_letters = self.expected_dead_letters;
        // The first host may be gone already (stopped for good, as the old release in a
        // rolling upgrade); the others are stopped here.
        let host = match self.host.is_some() {
            true => Some(self.take_host().await?),
            false => None,
        };
        let replicas: Vec<HostProcess> = self
            .replicas
            .iter_mut()
            .filter_map(|(_, process)| process.take())
            .collect();
        for replica in &replicas {
            self.unknown_before += replica.unknown_outcomes().await.unwrap_or(0);
        }
        figures.faults_in_send_window = self.unknown_before;
        figures.max_secs_to_ready = self.ready.iter().copied().reduce(f64::max);
        figures.never_ready = self.never_ready;
        if let Some(host) = host {
            let code = host.sigterm(STOP_WAIT).await?;
            if code != Some(0) {
                eprintln!("faults: the final SIGTERM ended the host with {code:?}");
                self.unclean_exits += 1;
            }
        }
        for replica in replicas {
            let code = replica.sigterm(STOP_WAIT).await?;
            if code != Some(0) {
                eprintln!("faults: the final SIGTERM ended a replica with {code:?}");
                self.unclean_exits += 1;
            }
        }
        figures.unclean_exits = self.unclean_exits;
        figures.unnoticed_faults = self.unnoticed_faults;
        if !figures.failures(f64::MAX).is_empty() {
            eprintln!("faults: the host's log: {}", self.command.log.display());
            for (replica, _) in &self.replicas {
                eprintln!("faults: a replica's log: {}", replica.log.display());
            }
        }
        Ok(())
    }
}
