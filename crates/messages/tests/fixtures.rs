//! The golden fixtures: every message as a release wrote it, in `tests/fixtures/`, one file a
//! type, version and (for an older shape of one version) variant:
//! `<type>.v<version>[.<variant>].json`. Today's types must read every one of them, through the
//! consumers' own decoder (`worker_core::decode`), because any of them may still be in flight:
//! in a retry tier, or as a dead letter replayed weeks later.
//!
//! The files are written once, from the release's own serializers, and never regenerated: a
//! change that breaks one is a breaking change (ARCHITECTURE.md, "Message contract").

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use worker_core::decode;
use worker_messages::{
    AUDIT_ENTRY, AUTOMATION_ACTION, ActionCommand, AuditEntry, DomainEvent, EMAIL_RECEIVED,
    EMAIL_SEND, EmailReceived, EmailSendCommand, Message, UNVERSIONED,
};

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Every `*.json` file of the folder, sorted.
fn fixtures() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(fixtures_dir())
        .expect("tests/fixtures")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    files
}

/// `email.send.v1.json` -> (`email.send`, 1); `email.received.v1.original.json` ->
/// (`email.received`, 1).
fn type_and_version(file_name: &str) -> Result<(String, u32), String> {
    let stem = file_name.strip_suffix(".json").ok_or("not a .json file")?;
    let parts: Vec<&str> = stem.split('.').collect();
    let at = parts
        .iter()
        .position(|part| {
            part.strip_prefix('v')
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter(|&at| at > 0)
        .ok_or("not named <type>.v<version>[.<variant>].json")?;
    let version = parts[at][1..].parse().map_err(|err| format!("{err}"))?;
    Ok((parts[..at].join("."), version))
}

/// `body` decoded as `M`, of a version `M` reads.
fn read_as<M: Message>(body: &[u8], version: u32) -> Result<M, String> {
    if version > M::VERSION {
        return Err(format!(
            "version {version} is newer than {} is today (v{})",
            M::TYPE,
            M::VERSION
        ));
    }
    decode::<M>(body).map_err(|err| err.to_string())
}

/// An event, envelope then data.
fn read_event<M: Message + DeserializeOwned>(body: &[u8], version: u32) -> Result<(), String> {
    let event = decode::<DomainEvent>(body).map_err(|err| err.to_string())?;
    if event.event_type != M::TYPE {
        return Err(format!(
            "its type is {:?}, not {}",
            event.event_type,
            M::TYPE
        ));
    }
    let data = serde_json::to_vec(&event.data).map_err(|err| err.to_string())?;
    read_as::<M>(&data, version).map(drop)
}

/// Decodes one fixture by the type its name says.
fn read_fixture(path: &Path) -> Result<(), String> {
    let name = path.file_name().and_then(|n| n.to_str()).ok_or("no name")?;
    let (kind, version) = type_and_version(name)?;
    let body = std::fs::read(path).map_err(|err| err.to_string())?;
    match kind.as_str() {
        EMAIL_RECEIVED => read_event::<EmailReceived>(&body, version),
        AUTOMATION_ACTION => read_as::<ActionCommand>(&body, version).map(drop),
        EMAIL_SEND => read_as::<EmailSendCommand>(&body, version).map(drop),
        AUDIT_ENTRY => read_as::<AuditEntry>(&body, version).map(drop),
        other => Err(format!("no message type is named {other:?}")),
    }
}

#[test]
fn todays_types_read_every_fixture() {
    let files = fixtures();
    assert!(
        files.len() >= 3,
        "no fixtures in {}",
        fixtures_dir().display()
    );
    let failures: Vec<String> = files
        .iter()
        .filter_map(|path| {
            read_fixture(path).err().map(|why| {
                let name = path.file_name().unwrap_or_default().to_string_lossy();
                format!("{name}: {why}")
            })
        })
        .collect();
    assert!(
        failures.is_empty(),
        "fixtures today's types do not read:\n{}",
        failures.join("\n")
    );
}

/// A type's version is raised with its fixture, so that the next release is held to it too.
#[test]
fn every_message_type_has_a_fixture_of_its_current_version() {
    for (kind, version) in [
        (EmailReceived::TYPE, EmailReceived::VERSION),
        (ActionCommand::TYPE, ActionCommand::VERSION),
        (EmailSendCommand::TYPE, EmailSendCommand::VERSION),
        (AuditEntry::TYPE, AuditEntry::VERSION),
    ] {
        let file = fixtures_dir().join(format!("{kind}.v{version}.json"));
        assert!(file.is_file(), "no fixture {}", file.display());
    }
}

/// The fields added to `email.received` since its first shape (commit 06f59e2) stay optional:
/// an event written before them reads, with their defaults.
#[test]
fn the_first_shape_of_email_received_reads_with_defaults() {
    let body = std::fs::read(fixtures_dir().join("email.received.v1.original.json")).unwrap();
    let event = decode::<DomainEvent>(&body).unwrap();
    let data: EmailReceived = serde_json::from_value(event.data).unwrap();
    assert_eq!(data.in_reply_to, None);
    assert!(data.cc.is_empty());
    assert!(!data.text_truncated && !data.null_sender);
    assert_eq!(data.auto_submitted, None);
    assert_eq!(data.x_autoreply, None);
}

/// A message without a version (the header is missing) is version 1, which every type reads;
/// the automation trigger reads an event by its type's version, else the envelope's.
#[test]
fn a_message_without_a_version_is_read_as_version_1() {
    assert_eq!(UNVERSIONED, 1);
    for version in [
        EmailReceived::VERSION,
        ActionCommand::VERSION,
        EmailSendCommand::VERSION,
    ] {
        assert!(version >= UNVERSIONED);
    }
    assert_eq!(
        DomainEvent::reads_version(EMAIL_RECEIVED),
        EmailReceived::VERSION
    );
    assert_eq!(
        DomainEvent::reads_version("order.placed"),
        DomainEvent::ENVELOPE_VERSION
    );
}

#[test]
fn fixture_names_give_the_type_and_version() {
    assert_eq!(
        type_and_version("email.send.v1.json"),
        Ok(("email.send".into(), 1))
    );
    assert_eq!(
        type_and_version("email.received.v12.original.json"),
        Ok(("email.received".into(), 12))
    );
    assert!(type_and_version("v1.json").is_err());
    assert!(type_and_version("email.send.json").is_err());
    assert!(type_and_version("email.send.vx.json").is_err());
}
