//! `worker-host mail show|find`: a mail's story, and the mails a search finds with the end
//! state of each (see [`worker_console::story`]). Every value that came with a mail (subject,
//! addresses, a server's answer) is printed through [`visible`]: a mail cannot send escapes to
//! the operator's terminal.

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use uuid::Uuid;
use worker_core::text::{visible, visible_json};

use super::dlq::parse_since;
use crate::connections;
use crate::exit::Fatal;
use crate::settings::Settings;
use worker_console::story::{self, Search, Story};

#[derive(Debug, Subcommand)]
pub enum MailAction {
    /// One stored inbound mail's story: each step with its time and the gap before it, the
    /// automations considered and the end state (answered, skipped and why, failed, waiting,
    /// in progress).
    Show {
        /// The stored inbound mail's id (as `mail find` and the console show it).
        id: Uuid,
        #[arg(long)]
        json: bool,
    },
    /// The mails a search finds, newest first, each with its end state.
    Find(FindArgs),
}

#[derive(Debug, Args)]
pub struct FindArgs {
    /// The sender's address (any case).
    #[arg(long)]
    pub from: Option<String>,
    /// The recipient of an answer (to or cc).
    #[arg(long)]
    pub to: Option<String>,
    /// The mail's Message-ID, with or without angle brackets.
    #[arg(long)]
    pub message_id: Option<String>,
    /// A part of the subject (any case).
    #[arg(long)]
    pub subject: Option<String>,
    /// Received at or after: an RFC 3339 time, 2026-11-29T10:00 (UTC) or an age (2h, 30m).
    #[arg(long, value_parser = parse_since)]
    pub since: Option<DateTime<Utc>>,
    /// Received before: an RFC 3339 time or an age.
    #[arg(long, value_parser = parse_since)]
    pub until: Option<DateTime<Utc>>,
    /// At most this many (1 to 200).
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    #[arg(long)]
    pub json: bool,
}

pub async fn run(settings: &Settings, action: MailAction) -> Result<(), Fatal> {
    let pool = worker_store::connect(&connections::pool_options(&settings.database))
        .await
        .map_err(Fatal::unavailable)?;
    let failed =
        |e: worker_core::Failure| Fatal::software(format!("reading the mail's story: {e}"));
    match action {
        MailAction::Show { id, json } => {
            let Some(story) = story::read_story(&pool, id, settings.story_retention())
                .await
                .map_err(failed)?
            else {
                return Err(Fatal::usage(format!(
                    "no stored inbound mail has id {id} (`worker-host mail find` lists them)"
                )));
            };
            if json {
                print_json(&story);
            } else {
                print_story(&story);
            }
        }
        MailAction::Find(args) => {
            let search = Search {
                from: args.from,
                to: args.to,
                message_id: args.message_id,
                subject: args.subject,
                since: args.since,
                until: args.until,
                after: None,
                limit: args.limit,
            };
            let found = story::find(&pool, &search).await.map_err(failed)?;
            if args.json {
                print_json(&found);
            } else if found.is_empty() {
                println!("no mail matches");
            } else {
                for mail in &found {
                    println!(
                        "{}  {}  {:<28}  {:<11}  {}",
                        mail.id,
                        mail.received_at.format("%Y-%m-%d %H:%M:%S"),
                        visible(mail.from.as_deref().unwrap_or("-")),
                        mail.end.name(),
                        visible(mail.subject.as_deref().unwrap_or(""))
                    );
                }
            }
        }
    }
    Ok(())
}

fn print_json(value: &impl serde::Serialize) {
    println!(
        "{}",
        visible_json(&serde_json::to_string_pretty(value).unwrap_or_default())
    );
}

fn print_story(story: &Story) {
    let mail = &story.mail;
    println!(
        "Mail {} from {} to {}: \"{}\"",
        mail.id,
        visible(mail.from_address.as_deref().unwrap_or("(no sender)")),
        visible(&mail.to_addresses.join(", ")),
        visible(mail.subject.as_deref().unwrap_or(""))
    );
    if let Some(message_id) = &mail.message_id {
        println!("Message-ID <{}>", visible(message_id));
    }
    println!("\n{}\n", visible(&story.end.sentence()));
    for step in &story.steps {
        let gap = step
            .gap_ms
            .map(|ms| format!("+{:.3}s", ms as f64 / 1000.0))
            .unwrap_or_default();
        let trace = step
            .trace_id
            .as_deref()
            .map(|t| format!("  [trace {}]", visible(t)))
            .unwrap_or_default();
        println!(
            "{}  {gap:>10}  {}{trace}",
            step.at.format("%Y-%m-%d %H:%M:%S%.3f"),
            visible(&step.text)
        );
    }
    let unmatched: Vec<_> = story
        .parts
        .verdicts
        .iter()
        .filter(|v| v.matched_at.is_none())
        .collect();
    if !unmatched.is_empty() {
        println!("\nAutomations that did not match:");
        for v in unmatched {
            let why = match (&v.unusable, v.enabled) {
                (Some(problem), _) => format!("its conditions cannot be used: {problem}"),
                (None, false) => "disabled".to_string(),
                (None, true) if v.failed_conditions.is_empty() => {
                    "its conditions hold now (changed since, or not yet acted on)".to_string()
                }
                (None, true) => format!("{} does not hold", v.failed_conditions.join(", ")),
            };
            let changed = if v.changed_since {
                " (edited since this mail)"
            } else {
                ""
            };
            println!("  {}: {}{changed}", visible(&v.automation), visible(&why));
        }
    }
    for note in &story.incomplete {
        println!("\nNote: {}", visible(note));
    }
}
