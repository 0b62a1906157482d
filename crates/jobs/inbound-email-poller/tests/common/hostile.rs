//! A corpus of hostile mails, generated (no binary fixtures): each one aims at one way a
//! parser can be made to spend unbounded time or memory, or to fall over.

use std::fmt::Write as _;

/// One hostile mail: a name for the test's messages, its Message-ID and its bytes.
pub struct Hostile {
    pub name: &'static str,
    pub message_id: String,
    pub raw: Vec<u8>,
}

fn head(message_id: &str, subject: &str, content_type: &str) -> String {
    format!(
        "Message-ID: <{message_id}>\r\nFrom: hostile@example.com\r\nTo: someone@localhost\r\n\
         Subject: {subject}\r\nDate: Tue, 1 Dec 2026 10:00:00 +0000\r\nMIME-Version: 1.0\r\n\
         Content-Type: {content_type}\r\n"
    )
}

fn mail(name: &'static str, build: impl FnOnce(&str) -> Vec<u8>) -> Hostile {
    let message_id = format!("{name}-{}@hostile.test", uuid::Uuid::new_v4().simple());
    let raw = build(&message_id);
    Hostile {
        name,
        message_id,
        raw,
    }
}

/// `depth` multiparts, each the only part of the one around it.
pub fn deep_nesting(depth: usize) -> Hostile {
    mail("deep-nesting", |id| {
        let mut m = head(id, "deep", "multipart/mixed; boundary=\"b0\"");
        m.push_str("\r\n");
        for level in 1..depth {
            let _ = write!(
                m,
                "--b{}\r\nContent-Type: multipart/mixed; boundary=\"b{level}\"\r\n\r\n",
                level - 1
            );
        }
        let _ = write!(
            m,
            "--b{}\r\nContent-Type: text/plain\r\n\r\nthe bottom\r\n",
            depth - 1
        );
        for level in (0..depth).rev() {
            let _ = write!(m, "--b{level}--\r\n");
        }
        m.into_bytes()
    })
}

/// One multipart with `parts` small text parts.
pub fn many_parts(parts: usize) -> Hostile {
    mail("many-parts", |id| {
        let mut m = head(id, "many parts", "multipart/mixed; boundary=\"p\"");
        m.push_str("\r\n");
        for i in 0..parts {
            let _ = write!(m, "--p\r\nContent-Type: text/plain\r\n\r\npart {i}\r\n");
        }
        m.push_str("--p--\r\n");
        m.into_bytes()
    })
}

/// A Subject of `bytes` bytes, folded into lines of 70.
pub fn megabyte_header(bytes: usize) -> Hostile {
    mail("megabyte-header", |id| {
        let mut subject = String::with_capacity(bytes + bytes / 35);
        while subject.len() < bytes {
            subject.push_str(&"s".repeat(70));
            subject.push_str("\r\n ");
        }
        let mut m = head(id, subject.trim_end(), "text/plain");
        m.push_str("\r\nbody\r\n");
        m.into_bytes()
    })
}

/// `count` header fields.
pub fn many_headers(count: usize) -> Hostile {
    mail("many-headers", |id| {
        let mut m = head(id, "many headers", "text/plain");
        for i in 0..count {
            let _ = write!(m, "X-H{i}: v\r\n");
        }
        m.push_str("\r\nbody\r\n");
        m.into_bytes()
    })
}

/// A To header of `count` addresses.
pub fn many_addresses(count: usize) -> Hostile {
    mail("many-addresses", |id| {
        let mut to = String::new();
        for i in 0..count {
            let _ = write!(to, "u{i}@example.com,\r\n ");
        }
        let m = format!(
            "Message-ID: <{id}>\r\nFrom: hostile@example.com\r\nTo: {}\r\nSubject: many\r\n\r\nbody\r\n",
            to.trim_end().trim_end_matches(',')
        );
        m.into_bytes()
    })
}

/// A text part of `bytes` bytes of base64 (decoding to 3/4 of it), in lines of 76, and a
/// second part of base64 with garbage in it.
pub fn base64_bomb(bytes: usize) -> Hostile {
    mail("base64-bomb", |id| {
        let mut m = head(id, "base64", "multipart/mixed; boundary=\"q\"");
        m.push_str("\r\n--q\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: base64\r\n\r\n");
        let line = "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFB\r\n";
        while m.len() < bytes {
            m.push_str(line);
        }
        m.push_str("--q\r\nContent-Type: text/plain\r\nContent-Transfer-Encoding: base64\r\n\r\n");
        m.push_str("QUFB!!!!====@@@@\x7f\x7fQUFB====QUFB\r\n--q--\r\n");
        m.into_bytes()
    })
}

/// A quoted-printable part of `bytes` bytes that is one logical line (soft breaks only) of
/// `=3D` escapes, and a second part of broken escapes.
pub fn quoted_printable_bomb(bytes: usize) -> Hostile {
    mail("qp-bomb", |id| {
        let mut m = head(id, "qp", "multipart/mixed; boundary=\"q\"");
        m.push_str("\r\n--q\r\nContent-Type: text/plain\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n");
        let line = format!("{}=\r\n", "=3D".repeat(25));
        while m.len() < bytes {
            m.push_str(&line);
        }
        m.push_str("\r\n--q\r\nContent-Type: text/plain\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n");
        m.push_str(&"=Z=\r=\n=0=".repeat(1000));
        m.push_str("\r\n--q--\r\n");
        m.into_bytes()
    })
}

/// Charsets nobody knows, UTF-7 and UTF-16 with bad sequences, encoded words with bogus
/// charsets, and bytes that are not UTF-8 in the headers.
pub fn broken_charsets() -> Hostile {
    mail("broken-charsets", |id| {
        let mut m = format!(
            "Message-ID: <{id}>\r\nFrom: =?x-bogus?B?AAAA?= <hostile@example.com>\r\n\
             To: someone@localhost\r\nSubject: =?utf-7?Q?+AGEAYgBj-+ZZZ?= =?utf-16?B?2D3YPQ==?= =?utf-8?B?wMHC?=\r\n\
             MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"c\"\r\n"
        )
        .into_bytes();
        m.extend_from_slice(b"X-Raw: \xff\xfe\xc0\xc1\xed\xa0\x80\r\n\r\n");
        for charset in [
            "x-unknown-charset",
            "utf-7",
            "utf-16",
            "iso-2022-jp",
            "gb18030",
            "",
        ] {
            m.extend_from_slice(
                format!("--c\r\nContent-Type: text/plain; charset=\"{charset}\"\r\n\r\n")
                    .as_bytes(),
            );
            m.extend_from_slice(b"+ZZZ-\xff\xfe\xd8\x00\x1b$B\x1b(\xc0\xaf\r\n");
        }
        m.extend_from_slice(b"--c--\r\n");
        m
    })
}

/// NUL bytes in a header, the body and an encoded word.
pub fn nuls() -> Hostile {
    mail("nuls", |id| {
        let mut m =
            format!("Message-ID: <{id}>\r\nFrom: hostile@example.com\r\nTo: someone@localhost\r\n")
                .into_bytes();
        m.extend_from_slice(b"Subject: nul\x00in the =?utf-8?B?AAAA?= subject\r\n");
        m.extend_from_slice(b"Content-Type: text/plain; charset=utf-8\r\n\r\n");
        m.extend_from_slice(b"a\x00b\x00\x00c\r\n");
        m
    })
}

/// A body that is one line of `bytes` bytes, without a line break.
pub fn overlong_line(bytes: usize) -> Hostile {
    mail("overlong-line", |id| {
        let mut m = head(id, "long line", "text/plain");
        m.push_str("\r\n");
        m.push_str(&"L".repeat(bytes));
        m.into_bytes()
    })
}

/// message/rfc822 parts nested `depth` deep, each one base64-encoded inside the next.
pub fn nested_messages(depth: usize) -> Hostile {
    mail("nested-messages", |id| {
        let mut inner = head(id, "innermost", "text/plain");
        inner.push_str("\r\nthe innermost\r\n");
        let mut inner = inner.into_bytes();
        for level in 0..depth {
            let mut outer = head(&format!("level{level}-{id}"), "wrapper", "message/rfc822");
            outer.push_str("\r\n");
            let mut outer = outer.into_bytes();
            outer.extend_from_slice(&inner);
            inner = outer;
        }
        // The outermost one keeps the corpus's Message-ID.
        let mut m = head(id, "nested", "message/rfc822");
        m.push_str("\r\n");
        let mut m = m.into_bytes();
        m.extend_from_slice(&inner);
        m
    })
}

/// A multipart's `message/rfc822` part that holds an empty `message/rfc822`: trips a
/// `debug_assert!` in mail-parser 0.11 (found by the parse properties).
pub fn empty_nested_message() -> Hostile {
    mail("empty-nested-message", |id| {
        let mut m = head(id, "empty nested", "multipart/mixed; boundary=\"b\"");
        m.push_str(
            "\r\n--b\r\nContent-Type: message/rfc822\r\n\r\n\
             Content-Type: message/rfc822\r\n\r\n\r\n--b--\r\n",
        );
        m.into_bytes()
    })
}

/// The corpus the poller's test runs: every mail is at most a few MB.
pub fn corpus() -> Vec<Hostile> {
    vec![
        deep_nesting(5_000),
        many_parts(10_000),
        megabyte_header(1024 * 1024),
        many_headers(50_000),
        many_addresses(50_000),
        base64_bomb(4 * 1024 * 1024),
        quoted_printable_bomb(2 * 1024 * 1024),
        broken_charsets(),
        nuls(),
        overlong_line(2 * 1024 * 1024),
        nested_messages(200),
        empty_nested_message(),
    ]
}
