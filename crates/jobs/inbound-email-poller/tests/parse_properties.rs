//! Properties of the poller's parse path ([`parse_within`]: the pre-scan, then mail-parser),
//! over arbitrary bytes and over mail-shaped bytes with hostile pieces: it never panics, and
//! what it returns is bounded. A fixed number of cases from a fixed seed, in the normal test
//! suite.

use job_inbound_email_poller::parse::{ParsedEmail, parse_within};
use job_inbound_email_poller::{MailLimits, OverLimit};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

const MAX_BODY_CHARS: usize = 500;
/// What the parse module keeps of one header value, and of one list.
const MAX_HEADER_CHARS: usize = 2_000;
const MAX_LIST_ITEMS: usize = 200;

const LIMITS: MailLimits = MailLimits {
    max_parts: 20,
    max_depth: 4,
    max_header_fields: 60,
    max_header_bytes: 4 * 1024,
};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        rng_seed: RngSeed::Fixed(0x5eed_0012),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Every field within its bound and free of NUL (PostgreSQL text refuses it).
fn assert_bounded(p: &ParsedEmail) {
    for body in [&p.text_body, &p.html_body].into_iter().flatten() {
        assert!(
            body.chars().count() <= MAX_BODY_CHARS,
            "a body of {} chars",
            body.chars().count()
        );
        assert!(!body.contains('\0'));
    }
    let headers = [
        &p.message_id,
        &p.from_address,
        &p.from_name,
        &p.subject,
        &p.in_reply_to,
    ];
    for value in headers.into_iter().flatten() {
        assert!(value.chars().count() <= MAX_HEADER_CHARS);
        assert!(!value.contains('\0'));
    }
    for list in [&p.to, &p.cc, &p.references] {
        assert!(list.len() <= MAX_LIST_ITEMS);
        assert!(
            list.iter()
                .all(|v| v.chars().count() <= MAX_HEADER_CHARS && !v.contains('\0'))
        );
    }
}

fn check(raw: &[u8]) {
    match parse_within(raw, MAX_BODY_CHARS, &LIMITS) {
        Ok(parsed) => assert_bounded(&parsed),
        Err(set_aside) => {
            assert_bounded(&set_aside.headers);
            assert!(
                set_aside.headers.text_body.is_none(),
                "a mail set aside is not parsed"
            );
            if let Some(len) = set_aside.refused.top_header_len {
                assert!(len <= raw.len());
            }
        }
    }
}

/// Pieces a hostile mail is made of.
fn piece() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"\r\n".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r\n\r\n".to_vec()),
        Just(b"Content-Type: multipart/mixed; boundary=\"b\"\r\n".to_vec()),
        Just(b"Content-Type: multipart/alternative; boundary=c\r\n".to_vec()),
        Just(b"Content-Type: message/rfc822\r\n".to_vec()),
        Just(b"Content-Type: text/plain; charset=\"x-bogus\"\r\n".to_vec()),
        Just(b"Content-Type: text/html; charset=utf-16\r\n".to_vec()),
        Just(b"Content-Transfer-Encoding: base64\r\n".to_vec()),
        Just(b"Content-Transfer-Encoding: quoted-printable\r\n".to_vec()),
        Just(b"--b\r\n".to_vec()),
        Just(b"--b--\r\n".to_vec()),
        Just(b"--c\r\n".to_vec()),
        Just(b"x--c".to_vec()),
        Just(b"Subject: =?utf-8?B?w6k=?= =?x-bogus?Q?=FF?=\r\n".to_vec()),
        Just(b"From: \"A\" <a@x>, b@y,\r\n c@z\r\n".to_vec()),
        Just(b"Message-ID: <id@x>\r\nReferences: <a@x> <b@x>\r\n".to_vec()),
        Just(b" folded continuation\r\n".to_vec()),
        Just(b"=3D=3D=\r\n=ZZ".to_vec()),
        Just(b"QUFBQUFB!!==\r\n".to_vec()),
        Just(b"\x00\x00".to_vec()),
        Just(b"\xff\xfe\xc0\xaf".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..64),
        (1usize..3000).prop_map(|n| vec![b'L'; n]),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_never_panic_and_give_bounded_fields(raw in proptest::collection::vec(any::<u8>(), 0..4096)) {
        check(&raw);
    }

    #[test]
    fn mail_shaped_hostile_bytes_never_panic_and_give_bounded_fields(
        pieces in proptest::collection::vec(piece(), 0..200)
    ) {
        check(&pieces.concat());
    }

    #[test]
    fn more_parts_than_the_limit_are_always_set_aside(parts in 21usize..200, hide in any::<bool>()) {
        // At the start of a line or hidden in the middle of one: either way, counted.
        let sep = if hide { "x--b" } else { "--b" };
        let mut raw = String::from("Subject: many\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\n");
        for i in 0..parts {
            raw.push_str(&format!("{sep}\r\n\r\npart {i}\r\n"));
        }
        let set_aside = parse_within(raw.as_bytes(), MAX_BODY_CHARS, &LIMITS).unwrap_err();
        prop_assert_eq!(set_aside.refused.over, OverLimit::Parts { limit: 20 });
        prop_assert_eq!(set_aside.headers.subject.as_deref(), Some("many"));
    }
}
