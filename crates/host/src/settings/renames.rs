//! Keys that moved. A settings file written for an earlier release keeps starting the host:
//! each old key is read as its new name (some as two new ones), with a warning that names
//! the old key, the new one and the release that will stop reading it. A file that sets both
//! an old key and its new name is refused, since the host cannot tell which one is meant.
//!
//! The renames are applied to the file's table before it is read, and to the environment's
//! keys, so that serde sees only today's names (a `#[serde(alias)]` cannot do this: the
//! defaults already set the new name, and serde refuses the pair as a duplicate field).

use std::fmt;

use toml::{Table, Value};

/// One key that moved.
#[derive(Debug, Clone, Copy)]
pub struct Rename {
    /// Its old dotted name.
    pub old: &'static str,
    /// Where its value is read now (one old timeout served two jobs).
    pub new: &'static [&'static str],
    /// The first release that no longer reads the old name.
    pub until: &'static str,
    /// Only a value of this old shape moves (a queue once named by a string is a table now).
    pub only_text: bool,
    /// For a key no longer used (no new name): what does its work now, for the warning.
    pub instead: Option<&'static str>,
}

const fn rename(old: &'static str, new: &'static [&'static str]) -> Rename {
    Rename {
        old,
        new,
        until: "0.3.0",
        only_text: false,
        instead: None,
    }
}

/// A key no longer used: taken out of the file with a warning, until it is refused.
const fn removed(old: &'static str) -> Rename {
    rename(old, &[])
}

/// A key no longer used because something else does its work now, which the warning names.
const fn superseded(old: &'static str, instead: &'static str) -> Rename {
    Rename {
        instead: Some(instead),
        ..removed(old)
    }
}

const fn queue(old: &'static str, new: &'static [&'static str]) -> Rename {
    Rename {
        only_text: true,
        ..rename(old, new)
    }
}

/// Every key renamed since the first release, oldest first.
pub const RENAMES: &[Rename] = &[
    // The shared timeouts became each job's own (each job crate owns its section).
    rename(
        "workers.timeouts.automation",
        &[
            "jobs.automation_trigger.timeout",
            "jobs.automation_action.timeout",
        ],
    ),
    rename(
        "workers.timeouts.webhook",
        &["jobs.automation_action.webhook_timeout"],
    ),
    rename("workers.timeouts.email_send", &["jobs.email_send.timeout"]),
    rename(
        "workers.timeouts.outbox_batch",
        &["jobs.outbox_drain.timeout"],
    ),
    rename("workers.timeouts.health", &["jobs.db_health.timeout"]),
    rename("workers.timeouts.draft", &["jobs.draft_expiry.timeout"]),
    rename(
        "workers.timeouts.imap_connect",
        &["jobs.inbound_email_poller.connect_timeout"],
    ),
    rename(
        "workers.timeouts.imap_message",
        &["jobs.inbound_email_poller.message_timeout"],
    ),
    rename(
        "smtp.claim_stale_after",
        &["jobs.email_send.claim_stale_after"],
    ),
    // Batches moved under the section of what they size.
    rename(
        "jobs.outbox_drain.batch_size",
        &["jobs.outbox_drain.drain.batch_size"],
    ),
    rename(
        "jobs.inbound_email_poller.batch_size",
        &["jobs.inbound_email_poller.max_messages_per_account"],
    ),
    // A consumer's queue became a table of its topology.
    queue(
        "jobs.automation_trigger.queue",
        &["jobs.automation_trigger.queue.name"],
    ),
    queue(
        "jobs.automation_action.queue",
        &["jobs.automation_action.queue.name"],
    ),
    queue("jobs.email_send.queue", &["jobs.email_send.queue.name"]),
    // Tries, not attempts: one word for one concept.
    rename("workers.retry.max_attempts", &["workers.retry.max_tries"]),
    // The outbox's backoff only spaces a row's attempts, which `drain.max_attempts` counts:
    // its own count of tries was read and never used.
    removed("jobs.outbox_drain.drain.backoff.max_attempts"),
    removed("jobs.outbox_drain.drain.backoff.max_tries"),
    // The reply limit belongs to the job that sends the replies.
    rename(
        "auto_replies.per_recipient",
        &["jobs.automation_action.auto_replies.per_recipient"],
    ),
    rename(
        "auto_replies.window",
        &["jobs.automation_action.auto_replies.window"],
    ),
    rename(
        "jobs.dead_letter_archive.maintenance_schedule",
        &["jobs.dead_letter_archive.schedule"],
    ),
    // One word for one concept: consumers settle at shutdown (the outbox drain keeps "drain"),
    // retention sweeps (an operator's purge of dead letters keeps "purge").
    rename("workers.drain_deadline", &["workers.settle_deadline"]),
    // The drain's sweep became `sweep_interval`, and then went (below): read as nothing.
    superseded("jobs.outbox_drain.drain.purge_interval", SWEPT_BY_RETENTION),
    // How long rows are kept is the retention job's, which deletes them.
    rename(
        "workers.dedup_retention",
        &["jobs.retention.processed_messages"],
    ),
    rename(
        "workers.attempt_log.retention",
        &["jobs.retention.attempt_log"],
    ),
    // The drain deletes a row once the broker confirmed it: it keeps no processed rows to
    // age out, and the retention job removes those that earlier releases kept.
    superseded("jobs.outbox_drain.drain.retention", SWEPT_BY_RETENTION),
    superseded("jobs.outbox_drain.drain.sweep_interval", SWEPT_BY_RETENTION),
];

/// What replaced the drain's sweep of processed rows.
const SWEPT_BY_RETENTION: &str = "the outbox drain now deletes each row once the broker confirmed it, and the retention job (`[jobs.retention]`, its `schedule` and `batch_size`) removes the processed rows earlier releases kept";

/// An old key read as its new name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deprecation {
    /// Where it was written: the file, or the environment variable.
    pub source: String,
    pub old: String,
    pub new: Vec<String>,
    pub until: &'static str,
    /// What does the work of a key no longer used.
    pub instead: Option<&'static str>,
}

impl fmt::Display for Deprecation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.new.is_empty() {
            let instead = self
                .instead
                .map(|what| format!(" ({what})"))
                .unwrap_or_default();
            return write!(
                f,
                "{}: key `{}` is no longer used{instead}: it is ignored until release {}, which refuses it; remove it",
                self.source, self.old, self.until
            );
        }
        write!(
            f,
            "{}: key `{}` is now `{}`: it is read under its new name until release {}, which refuses it; rename it there",
            self.source,
            self.old,
            self.new.join("` and `"),
            self.until
        )
    }
}

fn get<'a>(table: &'a Table, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let first = parts.next()?;
    parts.try_fold(table.get(first)?, |value, part| value.as_table()?.get(part))
}

/// Takes the value at `path` out of `table`, dropping tables it leaves empty.
fn take(table: &mut Table, path: &str) -> Option<Value> {
    match path.split_once('.') {
        None => table.remove(path),
        Some((first, rest)) => {
            let inner = table.get_mut(first)?.as_table_mut()?;
            let value = take(inner, rest);
            if inner.is_empty() {
                table.remove(first);
            }
            value
        }
    }
}

fn put(table: &mut Table, path: &str, value: Value) {
    match path.split_once('.') {
        None => {
            table.insert(path.to_string(), value);
        }
        Some((first, rest)) => {
            let inner = table
                .entry(first.to_string())
                .or_insert_with(|| Value::Table(Table::new()));
            if let Some(inner) = inner.as_table_mut() {
                put(inner, rest, value);
            }
        }
    }
}

/// Reads every old key of `table` (the file `source`) under its new name. Errors: the keys
/// set both ways, each as (old, new).
pub fn apply(table: &mut Table, source: &str) -> Result<Vec<Deprecation>, Vec<(String, String)>> {
    let mut moved = Vec::new();
    let mut both = Vec::new();
    for rename in RENAMES {
        let Some(old) = get(table, rename.old) else {
            continue;
        };
        if rename.only_text && !old.is_str() {
            continue;
        }
        let clash: Vec<_> = rename
            .new
            .iter()
            .filter(|new| get(table, new).is_some())
            .collect();
        if let Some(new) = clash.first() {
            both.push((rename.old.to_string(), (**new).to_string()));
            continue;
        }
        let Some(value) = take(table, rename.old) else {
            continue;
        };
        for new in rename.new {
            put(table, new, value.clone());
        }
        moved.push(deprecation(rename, source.to_string()));
    }
    if both.is_empty() {
        Ok(moved)
    } else {
        Err(both)
    }
}

fn deprecation(rename: &Rename, source: String) -> Deprecation {
    Deprecation {
        source,
        old: rename.old.to_string(),
        new: rename.new.iter().map(|n| (*n).to_string()).collect(),
        until: rename.until,
        instead: rename.instead,
    }
}

/// The new names of an environment override's dotted `key`, if it is an old one.
pub fn env_key(key: &str) -> Option<&'static Rename> {
    RENAMES
        .iter()
        .find(|rename| rename.old == key && !rename.only_text)
}

/// The deprecation an old environment key makes.
pub fn env_deprecation(rename: &Rename, var: &str) -> Deprecation {
    deprecation(rename, format!("environment variable {var}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> Table {
        text.parse().unwrap()
    }

    #[test]
    fn an_old_key_is_read_under_its_new_name_and_its_empty_table_goes() {
        let mut file =
            table("[workers.timeouts]\nemail_send = \"90s\"\n[workers]\nshutdown_grace = \"5s\"\n");
        let moved = apply(&mut file, "old.toml").unwrap();
        assert_eq!(moved.len(), 1);
        assert_eq!(
            get(&file, "jobs.email_send.timeout").and_then(Value::as_str),
            Some("90s")
        );
        assert!(get(&file, "workers.timeouts").is_none());
        assert!(get(&file, "workers.shutdown_grace").is_some());
        let said = moved[0].to_string();
        assert!(
            said.contains("workers.timeouts.email_send")
                && said.contains("jobs.email_send.timeout")
                && said.contains("0.3.0"),
            "{said}"
        );
    }

    #[test]
    fn one_old_timeout_sets_both_jobs_it_served() {
        let mut file = table("[workers.timeouts]\nautomation = \"45s\"\n");
        apply(&mut file, "old.toml").unwrap();
        for job in ["automation_trigger", "automation_action"] {
            let key = format!("jobs.{job}.timeout");
            assert_eq!(
                get(&file, &key).and_then(Value::as_str),
                Some("45s"),
                "{key}"
            );
        }
    }

    #[test]
    fn a_queue_named_by_a_string_becomes_its_tables_name_and_a_table_stays() {
        let mut old = table("[jobs.email_send]\nqueue = \"mail.out\"\n");
        apply(&mut old, "old.toml").unwrap();
        assert_eq!(
            get(&old, "jobs.email_send.queue.name").and_then(Value::as_str),
            Some("mail.out")
        );
        let mut new = table("[jobs.email_send.queue]\nname = \"mail.out\"\n");
        assert!(apply(&mut new, "new.toml").unwrap().is_empty());
    }

    #[test]
    fn a_key_set_both_ways_is_refused_naming_both() {
        let mut file = table("[workers.retry]\nmax_attempts = 3\nmax_tries = 4\n");
        let both = apply(&mut file, "f.toml").unwrap_err();
        assert_eq!(
            both,
            [(
                "workers.retry.max_attempts".to_string(),
                "workers.retry.max_tries".to_string()
            )]
        );
    }

    #[test]
    fn the_upgrade_guide_lists_every_rename() {
        let guide = include_str!("../../../../docs/UPGRADING.md");
        for rename in RENAMES {
            let row = format!("| `{}` |", rename.old);
            assert!(
                guide.contains(&row),
                "docs/UPGRADING.md has no row for {}",
                rename.old
            );
            for new in rename.new {
                assert!(guide.contains(&format!("`{new}`")), "{new}");
            }
        }
    }

    #[test]
    fn the_consumers_drain_deadline_is_their_settle_deadline_and_the_purge_is_gone() {
        let mut file = table(
            "[workers]\ndrain_deadline = \"12s\"\n[jobs.outbox_drain.drain]\npurge_interval = \"5m\"\n",
        );
        let moved = apply(&mut file, "old.toml").unwrap();
        assert_eq!(moved.len(), 2);
        assert_eq!(
            get(&file, "workers.settle_deadline").and_then(Value::as_str),
            Some("12s")
        );
        assert!(get(&file, "jobs.outbox_drain.drain.sweep_interval").is_none());
        assert!(get(&file, "workers.drain_deadline").is_none());
        assert!(get(&file, "jobs.outbox_drain.drain.purge_interval").is_none());
    }

    #[test]
    fn the_drains_retention_is_ignored_with_a_warning_naming_the_retention_job() {
        let mut file = table(
            "[jobs.outbox_drain.drain]\nretention = \"3days\"\nsweep_interval = \"5m\"\nbatch_size = 10\n",
        );
        let moved = apply(&mut file, "old.toml").unwrap();
        assert_eq!(moved.len(), 2, "{moved:?}");
        assert!(get(&file, "jobs.outbox_drain.drain.retention").is_none());
        assert!(get(&file, "jobs.outbox_drain.drain.sweep_interval").is_none());
        assert!(get(&file, "jobs.outbox_drain.drain.batch_size").is_some());
        let said = moved[0].to_string();
        assert!(
            said.contains("`jobs.outbox_drain.drain.retention` is no longer used")
                && said.contains("deletes each row once the broker confirmed it")
                && said.contains("[jobs.retention]")
                && said.contains("0.3.0"),
            "{said}"
        );
    }

    #[test]
    fn every_new_name_differs_from_its_old_one() {
        for rename in RENAMES {
            assert!(!rename.new.contains(&rename.old), "{}", rename.old);
        }
    }
}
