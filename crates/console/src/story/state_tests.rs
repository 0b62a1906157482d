//! The end state of a reply whose tries ran out: its dead letter decides, whatever order
//! rows of one millisecond come back in (issue 39).

use std::time::Duration;

use chrono::{DateTime, Utc};
use job_email_send::story::OutboundRecord;
use uuid::Uuid;
use worker_store::attempt_log::AttemptRecord;
use worker_store::dead_letters::DeadLetterSummary;

use super::*;

const MAIL: u128 = 7;

fn queued_reply(at: DateTime<Utc>) -> OutboundRecord {
    OutboundRecord {
        id: Uuid::from_u128(MAIL),
        action_execution_id: Some(Uuid::from_u128(1)),
        message_id: "7@worker-host".into(),
        to_addresses: vec!["ann@example.com".into()],
        cc_addresses: vec![],
        subject: "Re: ping".into(),
        // A reply whose tries ran out keeps the row's status: only its dead letter tells.
        status: "queued".into(),
        attempts: 15,
        last_error: Some("smtp-connect: connection refused".into()),
        smtp_response: None,
        created_at: at,
        updated_at: at,
        sent_at: None,
        expires_at: None,
        supersedes: None,
        superseded_by: None,
    }
}

fn gave_up(at: DateTime<Utc>) -> AttemptRecord {
    AttemptRecord {
        job: job_email_send::JOB_NAME.into(),
        message_id: Some(Uuid::from_u128(MAIL).to_string()),
        tick: None,
        attempt: 5,
        try_number: 0,
        outcome: "dead-lettered:gave-up".into(),
        is_final: true,
        failure_class: Some("transient".into()),
        error: None,
        duration: Duration::from_millis(3),
        at,
    }
}

fn dead_letter(id: i64, at: DateTime<Utc>, status: &str) -> DeadLetterSummary {
    DeadLetterSummary {
        id,
        queue: "email.send".into(),
        source: "runner".into(),
        reason: "gave-up".into(),
        class: Some("transient".into()),
        attempts: Some(5),
        message_id: Some(Uuid::from_u128(MAIL).to_string()),
        message_type: Some("email.send".into()),
        error: Some("smtp-connect: connection refused".into()),
        fingerprint: "f".into(),
        died_at: at,
        archived_at: at,
        status: status.into(),
        replayed_at: None,
        body_preview: String::new(),
        body_bytes: 0,
    }
}

fn parts(dead_letters: Vec<DeadLetterSummary>, attempts: Vec<AttemptRecord>) -> Parts {
    let at = Utc::now();
    Parts {
        outbound: vec![queued_reply(at)],
        dead_letters,
        attempts,
        ..Parts::default()
    }
}

#[test]
fn a_reply_that_gave_up_in_the_millisecond_of_its_last_try_ends_failed_with_its_dead_letter() {
    let at = Utc::now();
    for attempts in [
        vec![gave_up(at)],
        vec![gave_up(at), gave_up(at - chrono::Duration::seconds(1))],
    ] {
        let state =
            from_outbound(&parts(vec![dead_letter(72, at, "dead")], attempts)).expect("a state");
        assert_eq!(state.name(), "failed", "{state:?}");
        let sentence = state.sentence();
        assert!(sentence.contains("dead letter 72"), "{sentence}");
        assert!(
            sentence.contains("5 deliveries") && sentence.contains("15 tries"),
            "both counts are named: {sentence}"
        );
    }
}

#[test]
fn the_newest_dead_letter_decides_whatever_order_they_come_in() {
    let at = Utc::now();
    let replayed = dead_letter(71, at, "replayed");
    let dead = dead_letter(72, at, "dead");
    for order in [
        vec![replayed.clone(), dead.clone()],
        vec![dead.clone(), replayed.clone()],
    ] {
        let state = from_outbound(&parts(order, vec![])).expect("a state");
        assert_eq!(state.name(), "failed", "{state:?}");
        assert!(state.sentence().contains("dead letter 72"));
    }
}

#[test]
fn a_replayed_dead_letter_leaves_the_reply_waiting_with_both_counts() {
    let at = Utc::now();
    let state = from_outbound(&parts(
        vec![dead_letter(72, at, "replayed")],
        vec![gave_up(at)],
    ))
    .expect("a state");
    assert_eq!(state.name(), "waiting", "{state:?}");
    assert!(
        state.sentence().contains("try 15 (delivery 5)"),
        "{}",
        state.sentence()
    );
}
