//! `worker-host dlq`: the dead-letter archive on the command line — list, show, replay and
//! purge, as a readable table or as JSON. What a dead letter carries (its queue, error and
//! body come from outside) is printed through [`visible`], never raw to the terminal.

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use job_dead_letter_archive as archive;
use worker_core::text::{visible, visible_json};

use super::actor::{ActorArgs, actor};
use super::broker;
use crate::connections;
use crate::exit::Fatal;
use crate::settings::Settings;

#[derive(Debug, Subcommand)]
pub enum DlqAction {
    /// Per queue: dead letters waiting, the oldest and newest, and the top error fingerprints.
    List {
        #[arg(long)]
        json: bool,
    },
    /// The dead letters that match, newest first, with reason, attempts, error and a body
    /// preview; with an ID, that one dead letter whole.
    Show {
        /// One dead letter, whole (headers, properties and body).
        id: Option<i64>,
        #[command(flatten)]
        filter: FilterArgs,
        /// `dead` (the default), `replayed` or `purged`.
        #[arg(long)]
        status: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Publish the matching dead letters to their original queues again, attempt reset; each
    /// is marked replayed (never deleted) once the broker confirmed it.
    Replay {
        /// One dead letter by id.
        #[arg(long)]
        id: Option<i64>,
        #[command(flatten)]
        filter: FilterArgs,
        /// Every dead letter, when no filter narrows it.
        #[arg(long)]
        all: bool,
        /// List what would go; move nothing.
        #[arg(long)]
        dry_run: bool,
        /// At most this many messages per second.
        #[arg(long)]
        rate: Option<u32>,
        /// The count a dry run showed: replay at most this many, oldest first, and record it
        /// as what was confirmed; what died since stays dead.
        #[arg(long)]
        planned: Option<u64>,
        #[command(flatten)]
        actor: ActorArgs,
        #[arg(long)]
        json: bool,
    },
    /// Mark the matching dead letters purged (kept until the retention sweep).
    Purge {
        #[arg(long)]
        id: Option<i64>,
        #[command(flatten)]
        filter: FilterArgs,
        /// Every dead letter, when no filter narrows it.
        #[arg(long)]
        all: bool,
        /// Required: purging is deliberate. Without it, the count of what would go is shown
        /// and recorded as a dry run.
        #[arg(long)]
        yes: bool,
        /// The count the dry run showed: purge at most this many, oldest first, and record it
        /// as what was confirmed; what died since stays dead.
        #[arg(long)]
        planned: Option<u64>,
        #[command(flatten)]
        actor: ActorArgs,
        #[arg(long)]
        json: bool,
    },
}

/// The filters shared by show, replay and purge.
#[derive(Debug, Clone, Args)]
pub struct FilterArgs {
    /// The queue it died in (`outbox` for failed outbox rows).
    #[arg(long)]
    pub queue: Option<String>,
    /// `malformed`, `rejected`, `gave-up`, `delivery_limit`, `outbox-failed`, `unknown`.
    #[arg(long)]
    pub reason: Option<String>,
    /// An error fingerprint from `dlq list`, or its first 4+ hex digits.
    #[arg(long)]
    pub fingerprint: Option<String>,
    /// Died at or after: an RFC 3339 time (2026-11-29T10:00:00Z), 2026-11-29T10:00 (UTC) or an
    /// age (2h, 30m).
    #[arg(long, value_parser = parse_since)]
    pub since: Option<DateTime<Utc>>,
    /// Died before: an RFC 3339 time or an age.
    #[arg(long, value_parser = parse_since)]
    pub until: Option<DateTime<Utc>>,
    /// Text in the error, the message id or the body (the first 64 KiB of it).
    #[arg(long)]
    pub search: Option<String>,
    /// At most this many.
    #[arg(long)]
    pub limit: Option<u32>,
}

impl FilterArgs {
    fn filter(&self, id: Option<i64>) -> archive::Filter {
        archive::Filter {
            id,
            queue: self.queue.clone(),
            reason: self.reason.clone(),
            fingerprint: self.fingerprint.clone(),
            since: self.since,
            until: self.until,
            search: self.search.clone(),
            limit: self.limit,
            status: None,
        }
    }

    fn narrows(&self, id: Option<i64>) -> bool {
        self.filter(id).narrows()
    }
}

/// A time as an operator gives it on the command line (RFC 3339, a UTC time or an age);
/// clap names the flag (`--since`, `--until`) in front of the error.
pub(crate) fn parse_since(text: &str) -> Result<DateTime<Utc>, String> {
    archive::parse_time(text, Utc::now())
}

/// How many of a dry run's dead letters are replies the email-send job would now record
/// `expired` instead of sending (of the listed items: all of them unless the list was cut).
async fn would_expire(
    settings: &Settings,
    pool: &sqlx::PgPool,
    report: &archive::ReplayReport,
) -> Result<u64, Fatal> {
    let ids: Vec<String> = report
        .items
        .iter()
        .filter_map(|item| item.message_id.clone())
        .collect();
    job_email_send::expiry::would_expire(pool, &ids, settings.jobs.email_send.max_age)
        .await
        .map_err(Fatal::from_failure)
}

fn print_json(value: &impl serde::Serialize) {
    println!(
        "{}",
        visible_json(&serde_json::to_string_pretty(value).unwrap_or_default())
    );
}

fn when(at: Option<DateTime<Utc>>) -> String {
    at.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| "-".into())
}

/// `text` on one line of at most `chars` characters, each a terminal shows and never acts on.
fn cut(text: &str, chars: usize) -> String {
    let line = text.replace(['\n', '\r'], " ");
    let line = if line.chars().count() <= chars {
        line
    } else {
        format!("{}…", line.chars().take(chars).collect::<String>())
    };
    visible(&line).into_owned()
}

pub async fn run(settings: &Settings, action: DlqAction) -> Result<(), Fatal> {
    let pool = worker_store::connect(&connections::pool_options(&settings.database))
        .await
        .map_err(Fatal::unavailable)?;
    let result = dispatch(settings, &pool, action).await;
    pool.close().await;
    result
}

async fn dispatch(
    settings: &Settings,
    pool: &sqlx::PgPool,
    action: DlqAction,
) -> Result<(), Fatal> {
    match action {
        DlqAction::List { json } => {
            let queues = archive::list(pool).await.map_err(Fatal::from_failure)?;
            if json {
                print_json(&queues);
                return Ok(());
            }
            if queues.is_empty() {
                println!("the dead-letter archive is empty");
            }
            for queue in queues {
                println!(
                    "{}  dead {}  replayed {}  purged {}  oldest {}  newest {}",
                    visible(&queue.queue),
                    queue.dead,
                    queue.replayed,
                    queue.purged,
                    when(queue.oldest),
                    when(queue.newest)
                );
                for fp in queue.top_fingerprints {
                    println!(
                        "    {:>6}  {}  {}",
                        fp.count,
                        visible(&fp.fingerprint),
                        cut(&fp.normalized, 100)
                    );
                }
            }
        }
        DlqAction::Show { id: Some(id), .. } => {
            let Some(dead) = archive::show_one(pool, id)
                .await
                .map_err(Fatal::from_failure)?
            else {
                return Err(Fatal::usage(format!("no dead letter has id {id}")));
            };
            // One whole record is nested (headers, properties): its JSON is the readable form.
            print_json(&dead);
        }
        DlqAction::Show {
            id: None,
            filter,
            status,
            json,
        } => {
            let mut query = filter.filter(None);
            query.status = match status.as_deref() {
                None => None,
                Some("dead") => Some(archive::Status::Dead),
                Some("replayed") => Some(archive::Status::Replayed),
                Some("purged") => Some(archive::Status::Purged),
                Some(other) => {
                    return Err(Fatal::usage(format!(
                        "--status {other}: expected dead, replayed or purged"
                    )));
                }
            };
            query.validate().map_err(Fatal::usage)?;
            let rows = archive::show(pool, &query)
                .await
                .map_err(Fatal::from_failure)?;
            if json {
                print_json(&rows);
                return Ok(());
            }
            println!(
                "{:>7}  {:<19}  {:<20}  {:<14}  {:>3}  {:<12}  error / body",
                "id", "died at", "queue", "reason", "att", "fingerprint"
            );
            for row in rows {
                println!(
                    "{:>7}  {:<19}  {:<20}  {:<14}  {:>3}  {:<12}  {}",
                    row.id,
                    when(Some(row.died_at)),
                    cut(&row.queue, 20),
                    visible(&row.reason),
                    row.attempts
                        .map(|a| a.to_string())
                        .unwrap_or_else(|| "-".into()),
                    visible(&row.fingerprint),
                    cut(row.error.as_deref().unwrap_or(""), 80)
                );
                println!("{:>7}  body: {}", "", cut(&row.body_preview, 120));
            }
        }
        DlqAction::Replay {
            id,
            filter,
            all,
            dry_run,
            rate,
            planned,
            actor: given,
            json,
        } => {
            if !filter.narrows(id) && !all {
                return Err(Fatal::usage(
                    "replay needs --id, a filter (--queue, --reason, --fingerprint, --since, --until, --search) or --all",
                ));
            }
            if rate == Some(0) {
                return Err(Fatal::usage("--rate must be at least 1"));
            }
            let query = filter.filter(id);
            query.validate().map_err(Fatal::usage)?;
            // An edited dead letter's copy went out in its place (ServicePulse#2424).
            if let Some(id) = id {
                let found = worker_store::dead_letters::edited::status_of(pool, id)
                    .await
                    .map_err(Fatal::from_failure)?;
                if let Some((status, action)) = found.filter(|(s, _)| s == "edited") {
                    return Err(Fatal::usage(format!(
                        "dead letter {id} is `{status}`: an operator edited it (operator action {}) and its edited copy went out in its place; replaying it would send the original too",
                        action.map_or_else(|| "-".to_string(), |a| a.to_string())
                    )));
                }
            }
            let run = archive::Run::new(actor(&given))
                .dry(dry_run)
                .rate(rate)
                .planned(planned);
            let report = broker::with_session(settings, "dlq done", |session| async move {
                let publisher = broker::publisher_on(settings, &session);
                archive::replay_run(pool, &publisher, &query, &run).await
            })
            .await?
            .map_err(Fatal::from_failure)?;
            let expiring = if report.dry_run {
                Some(would_expire(settings, pool, &report).await?)
            } else {
                None
            };
            if json {
                let mut value = serde_json::to_value(&report).unwrap_or_default();
                if let (Some(count), Some(object)) = (expiring, value.as_object_mut()) {
                    object.insert("would_expire".into(), count.into());
                }
                print_json(&value);
            } else {
                let verb = if report.dry_run {
                    "would replay"
                } else {
                    "replayed"
                };
                println!(
                    "{verb} {} of {} matching dead letters; {} failed",
                    if report.dry_run {
                        report.matched
                    } else {
                        report.replayed
                    },
                    report.matched,
                    report.failed
                );
                for item in &report.items {
                    println!(
                        "    {:>7}  {:<20} -> {}/{}  {:?}{}",
                        item.id,
                        cut(&item.queue, 20),
                        if item.exchange.is_empty() {
                            "(default)".into()
                        } else {
                            visible(&item.exchange)
                        },
                        visible(&item.routing_key),
                        item.outcome,
                        item.error
                            .as_deref()
                            .map(|e| format!("  {}", visible(e)))
                            .unwrap_or_default()
                    );
                }
                if let Some(count) = expiring.filter(|&n| n > 0) {
                    println!(
                        "{}{count} of them are replies past their age limit (jobs.email_send.max_age or their automation's max_age): replayed now, they are recorded `expired` and not sent",
                        if report.items_truncated {
                            "at least "
                        } else {
                            ""
                        }
                    );
                }
                if let Some(why) = &report.stopped {
                    println!("stopped early: {}", visible(why));
                }
                if let Some(more) = report.beyond_planned {
                    println!(
                        "stopped at the {} planned: {more} more match and stay dead",
                        report.matched
                    );
                }
            }
            if report.failed > 0 || report.stopped.is_some() {
                return Err(Fatal::unavailable(format!(
                    "{} dead letters could not be replayed; they stay in the archive",
                    report.matched - report.replayed
                )));
            }
        }
        DlqAction::Purge {
            id,
            filter,
            all,
            yes,
            planned,
            actor: given,
            json,
        } => {
            if !filter.narrows(id) && !all {
                return Err(Fatal::usage(
                    "purge needs --id, a filter (--queue, --reason, --fingerprint, --since, --until, --search) or --all",
                ));
            }
            let query = filter.filter(id);
            query.validate().map_err(Fatal::usage)?;
            let actor = actor(&given);
            if !yes {
                let plan = archive::purge_dry_run(pool, &query, &actor)
                    .await
                    .map_err(Fatal::from_failure)?;
                return Err(Fatal::usage(format!(
                    "{} dead letters match; add --yes --planned {} to mark them purged (dry run recorded as action {})",
                    plan.matched, plan.matched, plan.action_id
                )));
            }
            let run = archive::Run::new(actor).planned(planned);
            let report = archive::purge_run(pool, &query, &run)
                .await
                .map_err(Fatal::from_failure)?;
            if json {
                print_json(&report);
            } else {
                println!(
                    "purged {} dead letters (action {})",
                    report.purged, report.action_id
                );
                if let Some(more) = report.beyond_planned {
                    println!(
                        "stopped at the {} planned: {more} more match and stay dead",
                        report.purged
                    );
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_age_too_far_back_is_an_error_not_a_panic() {
        let error = parse_since("300000y").unwrap_err();
        assert!(error.contains("300000y"), "{error}");
    }
}
