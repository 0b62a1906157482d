//! `automations import FILE`: parsing, validation and the upsert, on a real database.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::type_complexity)]

use std::path::Path;

use uuid::Uuid;
use worker_testkit::TestDb;

use job_automation_trigger::import::{Change, Format, ImportError, import_file, load_file, parse};

const DEMO: &str = r#"
[[automations]]
name = "reply-to-ping"
event_type = "email.received"
conditions = [{ path = "subject", op = "contains", value = "ping", ignore_case = true }]

[[automations.actions]]
type = "send_email"
to = ["{{ from }}"]
subject = "Re: {{ subject }}"
text = "pong"
"#;

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test]
async fn a_toml_file_is_imported_then_left_alone_then_updated() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let dir = tempfile::tempdir()?;
    let path = write(dir.path(), "demo.toml", DEMO);

    let first = import_file(&db.pool, &path).await?;
    assert_eq!(first.automations.len(), 1);
    assert_eq!(first.automations[0].change, Change::Created);
    let id = first.automations[0].id;
    let stored: (String, bool, String, serde_json::Value, serde_json::Value) = sqlx::query_as(
        "SELECT name, enabled, event_type, conditions, actions FROM automations WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await?;
    assert_eq!(
        (stored.0.as_str(), stored.1, stored.2.as_str()),
        ("reply-to-ping", true, "email.received")
    );
    assert_eq!(stored.3[0]["op"], "contains");
    assert_eq!(stored.4[0]["type"], "send_email");
    assert_eq!(stored.4[0]["reply_headers"], true);

    let again = import_file(&db.pool, &path).await?;
    assert_eq!(again.automations[0].change, Change::Unchanged);
    assert_eq!(again.automations[0].id, id);

    let path = write(
        dir.path(),
        "demo.toml",
        &DEMO.replace("text = \"pong\"", "text = \"pong!\""),
    );
    let changed = import_file(&db.pool, &path).await?;
    assert_eq!(
        (changed.automations[0].change, changed.automations[0].id),
        (Change::Updated, id)
    );
    assert!(
        changed
            .to_string()
            .ends_with("0 created, 1 updated, 0 unchanged"),
        "{changed}"
    );
    Ok(())
}

#[tokio::test]
async fn a_json_file_upserts_by_id_and_may_rename() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let dir = tempfile::tempdir()?;
    let id = Uuid::new_v4();
    let json = |name: &str| {
        format!(
            r#"{{"automations": [{{"id": "{id}", "name": "{name}", "event_type": "order.placed",
                "actions": [{{"type": "webhook", "url": "http://127.0.0.1:9/h"}}]}}]}}"#
        )
    };
    let created = import_file(&db.pool, &write(dir.path(), "a.json", &json("hook"))).await?;
    assert_eq!(
        (created.automations[0].id, created.automations[0].change),
        (id, Change::Created)
    );
    let renamed = import_file(
        &db.pool,
        &write(dir.path(), "a.json", &json("hook-renamed")),
    )
    .await?;
    assert_eq!(renamed.automations[0].change, Change::Updated);
    let name: String = sqlx::query_scalar("SELECT name FROM automations WHERE id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(name, "hook-renamed");

    // Another id claiming that name is refused, and the import writes nothing.
    let other = format!(
        r#"{{"automations": [
            {{"name": "fresh", "event_type": "x", "actions": [{{"type": "webhook", "url": "http://h/"}}]}},
            {{"id": "{}", "name": "hook-renamed", "event_type": "x",
              "actions": [{{"type": "webhook", "url": "http://h/"}}]}}]}}"#,
        Uuid::new_v4()
    );
    let err = import_file(&db.pool, &write(dir.path(), "b.json", &other))
        .await
        .unwrap_err();
    match err {
        ImportError::NameTaken { name, owner } => {
            assert_eq!((name.as_str(), owner), ("hook-renamed", id))
        }
        other => panic!("{other}"),
    }
    let fresh: i64 = sqlx::query_scalar("SELECT count(*) FROM automations WHERE name = 'fresh'")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(fresh, 0, "all or nothing");
    Ok(())
}

#[test]
fn every_problem_is_reported_at_once() {
    let text = r#"
[[automations]]
name = "bad"
event_type = ""
conditions = [{ path = "subject", op = "matches", value = "(unclosed" }]
actions = [
  { type = "send_email", to = ["{{ from"], subject = "x", text = "y" },
  { type = "webhook", url = "ftp://nope" },
]

[[automations]]
name = "bad"
event_type = "e"
actions = []
"#;
    let err = parse(text, Format::Toml, "f.toml").unwrap_err();
    let ImportError::Invalid { problems, .. } = &err else {
        panic!("{err}")
    };
    let all = problems.join("\n");
    for expected in [
        "automation `bad`: `event_type` is empty",
        "conditions[0]: invalid regular expression",
        "actions[0] (send_email): `to[0]` is not a valid template",
        "actions[1] (webhook): `url` must be an http:// or https:// URL",
        "the name appears more than once",
        "`actions` is empty",
    ] {
        assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
    }
    assert!(err.to_string().starts_with("f.toml: 6 problem(s)"), "{err}");
}

#[test]
fn a_reply_actions_max_age_is_read_and_zero_is_refused_by_name() {
    let with = |age: &str| {
        DEMO.replace(
            "text = \"pong\"\n",
            &format!("text = \"pong\"\nmax_age = \"{age}\"\n"),
        )
    };
    let fine = parse(&with("1day"), Format::Toml, "f.toml");
    assert!(fine.is_ok(), "{:?}", fine.err().map(|e| e.to_string()));
    let err = parse(&with("0s"), Format::Toml, "f.toml").unwrap_err();
    assert!(
        err.to_string()
            .contains("actions[0] (send_email): `max_age` is 0"),
        "{err}"
    );
}

#[test]
fn parse_errors_name_the_field() {
    let err = parse(
        r#"{"automations": [{"name": "x", "event_type": "e", "actions": [{"type": "sms"}]}]}"#,
        Format::Json,
        "f.json",
    )
    .unwrap_err();
    assert!(matches!(err, ImportError::Parse { .. }), "{err}");
    assert!(
        err.to_string().contains("automations[0].actions[0]"),
        "{err}"
    );

    let err = parse(
        "[[automations]]\nname = \"x\"\nevent_typo = \"e\"\n",
        Format::Toml,
        "f.toml",
    )
    .unwrap_err();
    assert!(err.to_string().contains("event_typo"), "{err}");
}

#[test]
fn the_format_comes_from_the_extension() {
    assert_eq!(Format::from_path(Path::new("a.TOML")), Some(Format::Toml));
    assert_eq!(Format::from_path(Path::new("a.json")), Some(Format::Json));
    assert!(matches!(
        load_file(Path::new("a.yaml")),
        Err(ImportError::UnknownFormat { .. })
    ));
    assert!(matches!(
        load_file(Path::new("/nonexistent/a.toml")),
        Err(ImportError::Read { .. })
    ));
}
