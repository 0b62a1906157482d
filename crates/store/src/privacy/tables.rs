//! Where a customer's personal data lives: each table and column that can hold a mail
//! address, a name, a subject or a body, how a row is tied to one person, and what an erasure
//! does to each column. docs/PRIVACY.md is this map in words; the erasure test scans every
//! text, JSON and byte column of the schema to prove the map complete.

/// How a column is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Text,
    TextArray,
    Json,
    Bytes,
}

/// What an erasure does to a column of a row that concerns the person.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Treat {
    /// The whole value is the person's (a subject, a body, a display name): `[erased]`.
    Whole,
    /// An address field: the person's address becomes their pseudonym (so that counts by
    /// address, the reply limit's among them, still add up); other addresses stay.
    Address,
    /// Text that may quote the address (an error, a header): each occurrence becomes
    /// `[erased]`. In JSON, a string holding it, and every string under a key that names a
    /// subject, a body or a name ([`WHOLE_KEYS`]), become `[erased]`.
    Scrub,
}

/// JSON keys whose strings are a mail's content wherever they appear (an event's data, an
/// action's snapshot, an edit's diff).
pub const WHOLE_KEYS: &[&str] = &[
    "subject",
    "text",
    "html",
    "text_body",
    "html_body",
    "body",
    "from_name",
    "parse_error",
    "before",
    "after",
];

#[derive(Debug, Clone, Copy)]
pub struct Column {
    pub name: &'static str,
    pub kind: Kind,
    pub treat: Treat,
}

const fn col(name: &'static str, kind: Kind, treat: Treat) -> Column {
    Column { name, kind, treat }
}

/// A table that holds personal data.
#[derive(Debug, Clone, Copy)]
pub struct Table {
    pub name: &'static str,
    /// What it is, for the export and the dry run.
    pub what: &'static str,
    pub columns: &'static [Column],
    /// Rows tied to the person by id rather than by text: a predicate over `$2`, the ids (as
    /// text) of the person's rows in the tables before this one.
    pub link: Option<&'static str>,
    /// Only these rows are considered (an audit entry still running is left alone).
    pub only: Option<&'static str>,
    /// Columns whose values (as text) are ids that tie later tables' rows to the person.
    pub ids: &'static [&'static str],
    /// Shown by the export and counted by the dry run, never changed: configuration an
    /// operator owns (an automation naming the address).
    pub read_only: bool,
}

use Kind::{Bytes, Json, Text, TextArray};
use Treat::{Address, Scrub, Whole};

/// Every table with personal data, in the order the ids tie them.
pub const TABLES: &[Table] = &[
    Table {
        name: "inbound_emails",
        what: "mails read from the IMAP mailboxes",
        columns: &[
            col("from_address", Text, Address),
            col("from_name", Text, Whole),
            col("to_addresses", TextArray, Address),
            col("cc_addresses", TextArray, Address),
            col("subject", Text, Whole),
            col("text_body", Text, Whole),
            col("html_body", Text, Whole),
            col("parse_error", Text, Whole),
            col("skip_reason", Text, Scrub),
            col("message_id", Text, Scrub),
            col("in_reply_to", Text, Scrub),
            col("reference_ids", TextArray, Scrub),
        ],
        link: None,
        only: None,
        ids: &["id", "event_id"],
        read_only: false,
    },
    Table {
        name: "action_executions",
        what: "automations' actions run for a mail (its event, the action as run)",
        columns: &[
            col("event", Json, Scrub),
            col("action", Json, Scrub),
            col("last_error", Text, Scrub),
            col("skip_reason", Text, Scrub),
        ],
        link: Some("event_id::text = ANY($2)"),
        only: None,
        ids: &["id"],
        read_only: false,
    },
    Table {
        name: "outbound_emails",
        what: "mails sent (or to send) by the host",
        columns: &[
            col("from_address", Text, Address),
            col("to_addresses", TextArray, Address),
            col("cc_addresses", TextArray, Address),
            col("subject", Text, Whole),
            col("text_body", Text, Whole),
            col("html_body", Text, Whole),
            col("in_reply_to", Text, Scrub),
            col("reference_ids", TextArray, Scrub),
            col("message_id", Text, Scrub),
            col("last_error", Text, Scrub),
            col("smtp_response", Text, Scrub),
        ],
        link: Some("action_execution_id::text = ANY($2)"),
        only: None,
        ids: &["id"],
        read_only: false,
    },
    Table {
        name: "outbound_bounces",
        what: "what delivery reports said of each recipient of a sent mail",
        columns: &[
            col("recipient", Text, Address),
            col("diagnostic", Text, Scrub),
        ],
        link: Some("(outbound_email_id::text = ANY($2) OR inbound_email_id::text = ANY($2))"),
        only: None,
        ids: &[],
        read_only: false,
    },
    Table {
        name: "outbound_email_recipients",
        what: "each sent mail's recipients, which the reply limit counts",
        columns: &[col("address", Text, Address)],
        link: None,
        only: None,
        ids: &[],
        read_only: false,
    },
    Table {
        name: "email_drafts",
        what: "drafts written by the platform",
        columns: &[
            col("recipients", TextArray, Address),
            col("subject", Text, Whole),
            col("text_body", Text, Whole),
            col("html_body", Text, Whole),
            col("in_reply_to", Text, Scrub),
        ],
        link: None,
        only: None,
        ids: &["id"],
        read_only: false,
    },
    Table {
        name: "outbox",
        what: "messages waiting to be published (events and commands)",
        columns: &[
            col("body", Bytes, Whole),
            col("headers", Json, Scrub),
            col("last_error", Text, Scrub),
        ],
        link: Some("message_id = ANY($2)"),
        only: None,
        ids: &[],
        read_only: false,
    },
    Table {
        name: "dead_letters",
        what: "the dead-letter archive",
        columns: &[
            col("body", Bytes, Whole),
            col("headers", Json, Scrub),
            col("amqp_headers", Json, Scrub),
            col("properties", Json, Scrub),
            col("last_error", Text, Scrub),
            col("error_normalized", Text, Scrub),
        ],
        link: Some("message_id = ANY($2)"),
        only: None,
        ids: &["id"],
        read_only: false,
    },
    Table {
        name: "attempt_log",
        what: "tries and outcomes of the messages handled for them",
        columns: &[col("error", Text, Scrub)],
        link: Some("message_id = ANY($2)"),
        only: None,
        ids: &[],
        read_only: false,
    },
    Table {
        name: "dead_letter_actions",
        what: "the operators' audit trail (edits of their mails, with the diff)",
        columns: &[col("filter", Json, Scrub), col("note", Text, Scrub)],
        link: Some(
            "(filter ->> 'outbound_email_id' = ANY($2) OR filter ->> 'dead_letter_id' = ANY($2))",
        ),
        only: Some("finished_at IS NOT NULL"),
        ids: &[],
        read_only: false,
    },
    Table {
        name: "automations",
        what: "automations whose conditions or actions name the address (configuration: shown, never erased)",
        columns: &[
            col("conditions", Json, Scrub),
            col("actions", Json, Scrub),
            col("name", Text, Scrub),
        ],
        link: None,
        only: None,
        ids: &[],
        read_only: true,
    },
    Table {
        name: "audit_log_entries",
        what: "other teams' audit entries naming the address (their append-only record of who did what: shown, never erased here; jobs.retention.audit_log deletes them by age)",
        columns: &[
            col("actor", Text, Scrub),
            col("entity_id", Text, Scrub),
            col("data", Json, Scrub),
        ],
        link: None,
        only: None,
        ids: &[],
        read_only: true,
    },
];
