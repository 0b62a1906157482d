//! The loop's statements and transactions by hop, from the host's log with sqlx's statement
//! log on (`sqlx::query=debug`): each statement is charged to the hop whose span it ran in,
//! and the timers, the sampler and anything outside a hop are counted apart.

use std::collections::BTreeMap;

/// A hop of the loop, or what is not one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Hop {
    Poller,
    Drain,
    /// A consumer, by its queue.
    Consumer(String),
    /// A timer job other than the poller and the drain, or no span at all.
    Other(String),
}

impl Hop {
    pub fn is_loop(&self) -> bool {
        !matches!(self, Hop::Other(_))
    }

    pub fn name(&self) -> String {
        match self {
            Hop::Poller => "poller".into(),
            Hop::Drain => "outbox drain (three hops)".into(),
            Hop::Consumer(queue) => format!("consumer {queue}"),
            Hop::Other(what) => format!("not the loop: {what}"),
        }
    }
}

/// Round trips and transactions of one hop.
#[derive(Debug, Clone, Copy, Default)]
pub struct Count {
    /// Statements sent, with the `BEGIN` of each explicit transaction (sqlx logs its `COMMIT`
    /// and `ROLLBACK`, not its `BEGIN`).
    pub statements: usize,
    /// Explicit transactions, and statements outside one (each its own).
    pub transactions: usize,
}

/// Counts the statement log lines of `log` by hop. A hop's statements since its span's last
/// `COMMIT` or `ROLLBACK` belong to the transaction that ends with the next one; those that no
/// `COMMIT` follows ran on their own.
pub fn count(log: &str) -> BTreeMap<Hop, Count> {
    let mut counts: BTreeMap<Hop, Count> = BTreeMap::new();
    // Statements since the last end of a transaction, by the span chain that sent them: one
    // chain's statements run one after another on one task.
    let mut pending: BTreeMap<String, (Hop, usize)> = BTreeMap::new();
    for line in log.lines() {
        let line = strip_ansi(line);
        let Some(at) = line.find("sqlx::query") else {
            continue;
        };
        let chain = spans_of(&line[..at]);
        let hop = hop_of(&chain);
        let summary = summary_of(&line[at..]);
        let entry = counts.entry(hop.clone()).or_default();
        entry.statements += 1;
        let open = pending.entry(chain).or_insert((hop, 0));
        if summary.starts_with("commit") || summary.starts_with("rollback") {
            entry.transactions += 1;
            entry.statements += 1;
            open.1 = 0;
        } else {
            open.1 += 1;
        }
    }
    for (hop, alone) in pending.into_values() {
        counts.entry(hop).or_default().transactions += alone;
    }
    counts
}

/// The span chain before the event's target: `a{..}:b{..}:`.
fn spans_of(prefix: &str) -> String {
    // "<time> <LEVEL> <spans>: " — the spans start after the level.
    let rest = prefix
        .split_once("DEBUG ")
        .map(|(_, r)| r)
        .unwrap_or(prefix);
    rest.trim().to_string()
}

fn summary_of(event: &str) -> String {
    event
        .split_once("summary=\"")
        .map(|(_, r)| r.split('"').next().unwrap_or(""))
        .unwrap_or("")
        .to_lowercase()
}

fn hop_of(chain: &str) -> Hop {
    if let Some((_, rest)) = chain.split_once("messaging.destination.name=") {
        let queue = rest
            .split(|c: char| c.is_whitespace() || c == '}')
            .next()
            .unwrap_or("");
        if chain.contains("consume{") {
            return Hop::Consumer(queue.to_string());
        }
    }
    if chain.contains("outbox.publish{") || chain.contains("job=outbox-drain") {
        return Hop::Drain;
    }
    if chain.contains("poll{") || chain.contains("job=inbound-email-poller") {
        return Hop::Poller;
    }
    if let Some((_, rest)) = chain.split_once("job=") {
        let job = rest
            .split(|c: char| c.is_whitespace() || c == '}')
            .next()
            .unwrap_or("");
        return Hop::Other(job.to_string());
    }
    Hop::Other("no job's span".into())
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC '[' params final-byte
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The table of `counts` per mail, and the loop's totals.
pub fn print(counts: &BTreeMap<Hop, Count>, mails: usize) {
    let per = |n: usize| n as f64 / mails as f64;
    println!("| hop | round trips (statements) per mail | transactions per mail |");
    println!("|---|---:|---:|");
    let (mut statements, mut transactions) = (0, 0);
    for (hop, count) in counts.iter().filter(|(h, _)| h.is_loop()) {
        statements += count.statements;
        transactions += count.transactions;
        println!(
            "| {} | {:.1} | {:.2} |",
            hop.name(),
            per(count.statements),
            per(count.transactions)
        );
    }
    println!(
        "| **the loop** | **{:.1}** | **{:.2}** |",
        per(statements),
        per(transactions)
    );
    for (hop, count) in counts.iter().filter(|(h, _)| !h.is_loop()) {
        println!(
            "| {} | {:.1} | {:.2} |",
            hop.name(),
            per(count.statements),
            per(count.transactions)
        );
    }
}
