//! The parts of a mail's story past the mail itself, as their owners read them.

use job_automation_action::story::ExecutionRecord;
use job_automation_trigger::story::Verdict;
use job_email_send::story::OutboundRecord;
use job_inbound_email_poller::bounce::story::BounceRecord;
use serde::Serialize;
use worker_store::attempt_log::AttemptRecord;
use worker_store::dead_letters::DeadLetterSummary;
use worker_store::outbox::Publication;

/// Everything recorded about one mail's handling, past the mail itself.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Parts {
    pub publications: Vec<Publication>,
    pub verdicts: Vec<Verdict>,
    pub executions: Vec<ExecutionRecord>,
    pub outbound: Vec<OutboundRecord>,
    /// The failed tries and final outcomes of the action and send commands.
    pub attempts: Vec<AttemptRecord>,
    pub dead_letters: Vec<DeadLetterSummary>,
    /// What delivery reports said of the outbound mails, recipient by recipient.
    pub bounces: Vec<BounceRecord>,
    /// When the mail is itself a delivery report: what it said.
    pub reported: Vec<BounceRecord>,
}
