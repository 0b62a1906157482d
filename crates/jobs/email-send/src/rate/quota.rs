//! A provider's answer that its sending limit is reached ([`quota_of`]): the account's, not
//! the mail's. It opens the relay's circuit until the window it names rolls over, and the
//! mail goes back to its queue charged nothing.

use crate::error::{SendError, server_answer};

/// Which window a quota answer is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaWindow {
    /// Too many at once or too fast (Microsoft's `432 4.3.2` concurrent connections): the
    /// minute's window.
    Minute,
    /// The day's limit (Microsoft's `554 5.2.0 ... SubmissionQuotaExceededException`,
    /// Google's `550 5.4.5 Daily user sending limit exceeded`).
    Day,
}

/// A quota answer: its window and the server's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaAnswer {
    pub window: QuotaWindow,
    pub answer: String,
}

/// Whether `err` is the provider saying the account's sending limit is reached.
pub fn quota_of(err: &SendError) -> Option<QuotaAnswer> {
    let SendError::Smtp(smtp) = err else {
        return None;
    };
    let answer = server_answer(smtp)?;
    let window = window_of(&answer)?;
    Some(QuotaAnswer { window, answer })
}

/// The window a server's answer (`554 5.2.0 ...`) says is used up, if it says so.
pub fn window_of(answer: &str) -> Option<QuotaWindow> {
    let mut words = answer.split_whitespace();
    let code = words.next()?;
    let enhanced = words.next().unwrap_or_default();
    let lower = answer.to_ascii_lowercase();
    match (code, enhanced) {
        ("432", "4.3.2") => Some(QuotaWindow::Minute),
        ("554", "5.2.0") if lower.contains("submissionquotaexceeded") => Some(QuotaWindow::Day),
        ("550", "5.4.5") => Some(QuotaWindow::Day),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_providers_quota_answers_are_known_and_a_recipients_refusal_is_not() {
        assert_eq!(
            window_of("432 4.3.2 Concurrent connections limit exceeded"),
            Some(QuotaWindow::Minute)
        );
        assert_eq!(
            window_of("554 5.2.0 STOREDRV.Submission.Exception:SubmissionQuotaExceededException"),
            Some(QuotaWindow::Day)
        );
        assert_eq!(
            window_of("550 5.4.5 Daily user sending limit exceeded"),
            Some(QuotaWindow::Day)
        );
        assert_eq!(window_of("554 5.2.0 message rejected"), None);
        assert_eq!(window_of("550 5.1.1 no such user"), None);
    }
}
