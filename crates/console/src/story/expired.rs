//! The words for a reply recorded `expired`: past its age limit when its turn came, so the
//! email-send job did not send it (issue 39). The row keeps what the sentence needs: when it
//! was queued (`created_at`), when its turn came (`updated_at`, written as it expired), the
//! limit it passed (`expires_at`) and which limit that was (`last_error`).

use job_email_send::story::OutboundRecord;

/// "the reply to ann@example.com was 2 days old when its turn came, past
/// jobs.email_send.max_age (1 day)".
pub(super) fn expired_detail(mail: &OutboundRecord) -> String {
    let age = span(mail.updated_at - mail.created_at);
    let which = mail.last_error.as_deref().unwrap_or("its age limit");
    let limit = mail
        .expires_at
        .map(|at| format!(" ({})", span(at - mail.created_at)))
        .unwrap_or_default();
    format!(
        "the reply to {} was {age} old when its turn came, past {which}{limit}",
        mail.to_addresses.join(", ")
    )
}

/// A span in its largest whole unit: `2 days`, `1 hour`, `45 seconds`.
fn span(span: chrono::TimeDelta) -> String {
    let secs = span.num_seconds().max(0);
    let (count, unit) = [(86_400, "day"), (3_600, "hour"), (60, "minute")]
        .into_iter()
        .find(|(size, _)| secs >= *size)
        .map_or((secs, "second"), |(size, unit)| (secs / size, unit));
    let plural = if count == 1 { "" } else { "s" };
    format!("{count} {unit}{plural}")
}

#[cfg(test)]
mod tests {
    use chrono::{TimeDelta, Utc};
    use uuid::Uuid;

    use super::*;

    fn expired(age: TimeDelta, limit: TimeDelta, which: &str) -> OutboundRecord {
        let created = Utc::now() - age;
        OutboundRecord {
            id: Uuid::from_u128(1),
            action_execution_id: None,
            message_id: "1@worker-host".into(),
            to_addresses: vec!["ann@example.com".into()],
            cc_addresses: vec![],
            subject: "Re: ping".into(),
            status: "expired".into(),
            attempts: 0,
            last_error: Some(which.into()),
            smtp_response: None,
            created_at: created,
            updated_at: created + age,
            sent_at: None,
            expires_at: Some(created + limit),
            supersedes: None,
            superseded_by: None,
        }
    }

    #[test]
    fn an_expired_reply_says_how_old_it_was_and_which_limit_it_passed() {
        let mail = expired(
            TimeDelta::days(2) + TimeDelta::hours(3),
            TimeDelta::days(1),
            "jobs.email_send.max_age",
        );
        assert_eq!(
            expired_detail(&mail),
            "the reply to ann@example.com was 2 days old when its turn came, past jobs.email_send.max_age (1 day)"
        );
        let short = expired(TimeDelta::seconds(45), TimeDelta::minutes(10), "x");
        assert!(expired_detail(&short).contains("45 seconds old"));
        assert!(expired_detail(&short).contains("(10 minutes)"));
    }
}
