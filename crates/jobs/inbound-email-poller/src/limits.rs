//! A cheap pre-scan of a mail's structure, before mail-parser sees it.
//!
//! mail-parser bounds only how deep encoded `message/rfc822` parts nest (3 levels). It has no
//! limit on MIME parts, on multipart nesting, on header fields or on the size of a header
//! section, and it builds a structure per part and per header: a 13 MB mail of 300,000
//! parts took some 200 MB to parse, and four accounts polled at once can hold four of them.
//! [`prescan`] reads the bytes once line by line (header sections, Content-Type boundaries,
//! delimiter lines), then once more for boundary delimiters wherever they are (mail-parser
//! finds a delimiter anywhere, not only at the start of a line), allocates next to nothing,
//! and stops at the first limit passed. A mail past a limit is set aside unparsed.
//!
//! The scan is conservative where it is cheap to be: every `boundary=` anywhere in the mail
//! counts as a declared boundary, and every `--<boundary>` as a part. Nesting is followed
//! through header sections it can see; a nesting it cannot see (hidden behind a delimiter
//! in the middle of a line) still needs parts, which are counted. The message size limit
//! ([`crate::PollerConfig::max_message_bytes`]) stays the last bound.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

/// Bounds on a mail's structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MailLimits {
    /// Body parts of multiparts and nested messages, at every level together.
    pub max_parts: usize,
    /// Multiparts and `message/rfc822` parts inside one another.
    pub max_depth: usize,
    /// Header fields, in all header sections together (each part has one).
    pub max_header_fields: usize,
    /// Bytes of one header section (the mail's own, or a part's).
    pub max_header_bytes: usize,
}

impl Default for MailLimits {
    fn default() -> Self {
        // Real mail stays far below each: newsletters have tens of parts, a forward of a
        // forward nests a handful of levels, a long Received chain is some tens of KiB.
        Self {
            max_parts: 1_000,
            max_depth: 30,
            max_header_fields: 10_000,
            max_header_bytes: 256 * 1024,
        }
    }
}

/// Which limit a mail passed; the text is the row's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OverLimit {
    #[error("more than {limit} MIME parts")]
    Parts { limit: usize },
    #[error("MIME nesting deeper than {limit} levels")]
    Depth { limit: usize },
    #[error("more than {limit} header fields")]
    HeaderFields { limit: usize },
    #[error("a header section over {limit} bytes")]
    HeaderBytes { limit: usize },
}

/// A mail the pre-scan refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{over}")]
pub struct Refused {
    pub over: OverLimit,
    /// The length of the mail's own header section (with its blank line), when it was read
    /// whole within the limits: those bytes can still be parsed for the row's fields.
    pub top_header_len: Option<usize>,
}

/// What the pre-scan counted in a mail within the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Shape {
    pub parts: usize,
    pub depth: usize,
    pub header_fields: usize,
    /// The largest header section, in bytes.
    pub header_bytes: usize,
    pub top_header_len: Option<usize>,
}

/// The longest Content-Type value kept while reading a header section: a boundary is at
/// most 70 characters, the rest of the value is parameters we do not need.
const MAX_CONTENT_TYPE: usize = 4 * 1024;

#[derive(Debug)]
enum Frame {
    Multipart(Vec<u8>),
    Message,
}

/// Checks `raw` against `limits` without parsing it; see the module docs.
pub fn prescan(raw: &[u8], limits: &MailLimits) -> Result<Shape, Refused> {
    let mut shape = Shape::default();
    let refuse = |over, shape: &Shape| Refused {
        over,
        top_header_len: shape.top_header_len,
    };
    let mut frames: Vec<Frame> = Vec::new();
    let mut in_header = true;
    let mut section_bytes = 0usize;
    let mut content_type: Vec<u8> = Vec::new();
    let mut in_content_type = false;
    let mut offset = 0usize;

    for line in raw.split_inclusive(|b| *b == b'\n') {
        offset += line.len();
        let text = trim_eol(line);
        if in_header {
            if !text.is_empty() {
                section_bytes += line.len();
                if section_bytes > limits.max_header_bytes {
                    let over = OverLimit::HeaderBytes {
                        limit: limits.max_header_bytes,
                    };
                    return Err(refuse(over, &shape));
                }
                if matches!(text.first(), Some(b' ' | b'\t')) {
                    if in_content_type {
                        push_bounded(&mut content_type, text);
                    }
                } else {
                    shape.header_fields += 1;
                    if shape.header_fields > limits.max_header_fields {
                        let over = OverLimit::HeaderFields {
                            limit: limits.max_header_fields,
                        };
                        return Err(refuse(over, &shape));
                    }
                    in_content_type = false;
                    if let Some((name, value)) = split_field(text)
                        && name.trim_ascii().eq_ignore_ascii_case(b"content-type")
                    {
                        in_content_type = true;
                        content_type.clear();
                        push_bounded(&mut content_type, value);
                    }
                }
                continue;
            }
            // The blank line: the section ends.
            shape.header_bytes = shape.header_bytes.max(section_bytes);
            if shape.top_header_len.is_none() {
                shape.top_header_len = Some(offset);
            }
            section_bytes = 0;
            in_content_type = false;
            let (kind, boundary) = media_type(&content_type);
            let boundary = boundary.map(<[u8]>::to_vec);
            content_type.clear();
            in_header = false;
            match (kind, boundary) {
                (Kind::Multipart, Some(boundary)) => frames.push(Frame::Multipart(boundary)),
                (Kind::Message, _) => {
                    frames.push(Frame::Message);
                    in_header = true;
                }
                _ => {}
            }
            if frames.len() > limits.max_depth {
                let over = OverLimit::Depth {
                    limit: limits.max_depth,
                };
                return Err(refuse(over, &shape));
            }
            shape.depth = shape.depth.max(frames.len());
            continue;
        }
        let Some(rest) = text.strip_prefix(b"--") else {
            continue;
        };
        let found = frames.iter().rposition(|frame| match frame {
            Frame::Multipart(boundary) => rest.starts_with(boundary),
            Frame::Message => false,
        });
        let Some(at) = found else {
            continue;
        };
        let boundary_len = match &frames[at] {
            Frame::Multipart(boundary) => boundary.len(),
            Frame::Message => 0,
        };
        let closing = rest[boundary_len..].starts_with(b"--");
        frames.truncate(at + 1);
        if closing {
            frames.pop();
        } else {
            shape.parts += 1;
            if shape.parts > limits.max_parts {
                let over = OverLimit::Parts {
                    limit: limits.max_parts,
                };
                return Err(refuse(over, &shape));
            }
            in_header = true;
        }
    }
    shape.header_bytes = shape.header_bytes.max(section_bytes);

    let delimiters = delimiters_anywhere(raw, limits.max_parts + 1);
    if delimiters > limits.max_parts {
        let over = OverLimit::Parts {
            limit: limits.max_parts,
        };
        return Err(refuse(over, &shape));
    }
    shape.parts = shape.parts.max(delimiters);
    Ok(shape)
}

/// Counts `--<boundary>` (closing delimiters apart) wherever it is, for every boundary
/// declared anywhere in `raw`, up to `stop`.
fn delimiters_anywhere(raw: &[u8], stop: usize) -> usize {
    let Ok(declared) = AhoCorasickBuilder::new()
        .ascii_case_insensitive(true)
        .build(["boundary"])
    else {
        return 0;
    };
    let mut boundaries: Vec<&[u8]> = Vec::new();
    for found in declared.find_iter(raw) {
        let after = &raw[found.end()..raw.len().min(found.end() + MAX_CONTENT_TYPE)];
        if let Some(boundary) = parameter_value(after)
            && !boundaries.contains(&boundary)
        {
            boundaries.push(boundary);
            if boundaries.len() >= stop {
                // Every declared multipart has a part, or nearly: enough to refuse.
                return boundaries.len();
            }
        }
    }
    if boundaries.is_empty() {
        return 0;
    }
    // `--b--` (closing) before `--b` when both match at the same place.
    let mut patterns: Vec<Vec<u8>> = Vec::with_capacity(boundaries.len() * 2);
    for boundary in &boundaries {
        patterns.push([b"--", *boundary, b"--"].concat());
        patterns.push([b"--", *boundary].concat());
    }
    let Ok(search) = AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostLongest)
        .build(&patterns)
    else {
        return 0;
    };
    let mut parts = 0;
    for found in search.find_iter(raw) {
        if found.pattern().as_usize() % 2 == 1 {
            parts += 1;
            if parts >= stop {
                break;
            }
        }
    }
    parts
}

#[derive(Debug, PartialEq, Eq)]
enum Kind {
    Multipart,
    Message,
    Other,
}

/// The kind of a Content-Type value and its boundary parameter.
fn media_type(value: &[u8]) -> (Kind, Option<&[u8]>) {
    let value = value.trim_ascii_start();
    let starts = |prefix: &[u8]| {
        value.len() >= prefix.len() && value[..prefix.len()].eq_ignore_ascii_case(prefix)
    };
    if starts(b"multipart/") {
        let boundary =
            find_ignore_case(value, b"boundary").and_then(|at| parameter_value(&value[at + 8..]));
        (Kind::Multipart, boundary)
    } else if starts(b"message/rfc822") || starts(b"message/global") {
        (Kind::Message, None)
    } else {
        (Kind::Other, None)
    }
}

/// The value after a parameter's name: `="quoted"`, `=token`, also `*=` and `*0=` (RFC
/// 2231); `None` when there is no `=` or the value is empty.
fn parameter_value(after_name: &[u8]) -> Option<&[u8]> {
    let rest = after_name.trim_ascii_start();
    let rest = rest
        .strip_prefix(b"*0*")
        .or_else(|| rest.strip_prefix(b"*0"))
        .or_else(|| rest.strip_prefix(b"*"))
        .unwrap_or(rest);
    let rest = rest
        .trim_ascii_start()
        .strip_prefix(b"=")?
        .trim_ascii_start();
    let value = match rest.strip_prefix(b"\"") {
        Some(quoted) => {
            &quoted[..quoted
                .iter()
                .position(|b| *b == b'"')
                .unwrap_or(quoted.len())]
        }
        None => {
            let end = rest
                .iter()
                .position(|b| matches!(b, b';' | b' ' | b'\t' | b'\r' | b'\n'))
                .unwrap_or(rest.len());
            &rest[..end]
        }
    };
    (!value.is_empty()).then_some(value)
}

fn find_ignore_case(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|w| w.eq_ignore_ascii_case(needle))
}

fn split_field(line: &[u8]) -> Option<(&[u8], &[u8])> {
    let colon = line.iter().position(|b| *b == b':')?;
    Some((&line[..colon], &line[colon + 1..]))
}

fn push_bounded(buffer: &mut Vec<u8>, text: &[u8]) {
    let room = MAX_CONTENT_TYPE.saturating_sub(buffer.len());
    buffer.extend_from_slice(&text[..text.len().min(room)]);
}

fn trim_eol(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: MailLimits = MailLimits {
        max_parts: 3,
        max_depth: 2,
        max_header_fields: 20,
        max_header_bytes: 400,
    };

    fn multipart(parts: usize) -> Vec<u8> {
        let mut m = String::from(
            "Subject: x\r\nContent-Type: multipart/mixed;\r\n boundary=\"b\"\r\n\r\npreamble\r\n",
        );
        for i in 0..parts {
            m.push_str(&format!(
                "--b\r\nContent-Type: text/plain\r\n\r\npart {i}\r\n"
            ));
        }
        m.push_str("--b--\r\n");
        m.into_bytes()
    }

    #[test]
    fn a_mail_within_the_limits_passes_with_its_shape() {
        let shape = prescan(&multipart(3), &LIMITS).unwrap();
        assert_eq!((shape.parts, shape.depth, shape.header_fields), (3, 1, 5));
        assert_eq!(shape.top_header_len, Some(61));
        assert!(prescan(b"Subject: plain\r\n\r\n-- \r\nsignature\r\n", &LIMITS).is_ok());
    }

    #[test]
    fn each_limit_refuses_with_its_reason() {
        let parts = prescan(&multipart(4), &LIMITS).unwrap_err();
        assert_eq!(parts.over, OverLimit::Parts { limit: 3 });
        assert_eq!(
            parts.top_header_len,
            Some(61),
            "the own header still readable"
        );

        let nested = b"Content-Type: multipart/mixed; boundary=a\r\n\r\n--a\r\n\
Content-Type: message/rfc822\r\n\r\nContent-Type: multipart/mixed; boundary=c\r\n\r\n--c\r\n\r\nx\r\n";
        assert_eq!(
            prescan(nested, &LIMITS).unwrap_err().over,
            OverLimit::Depth { limit: 2 }
        );

        let fields = "X-A: 1\r\n".repeat(21) + "\r\nbody";
        let refused = prescan(fields.as_bytes(), &LIMITS).unwrap_err();
        assert_eq!(refused.over, OverLimit::HeaderFields { limit: 20 });
        assert_eq!(refused.top_header_len, None);

        let long = format!("Subject: {}\r\n\r\nbody", "s".repeat(400));
        assert_eq!(
            prescan(long.as_bytes(), &LIMITS).unwrap_err().over,
            OverLimit::HeaderBytes { limit: 400 }
        );
        assert_eq!(
            refused.to_string(),
            "more than 20 header fields",
            "the reason a row carries"
        );
    }

    #[test]
    fn delimiters_in_the_middle_of_a_line_are_counted_too() {
        // mail-parser finds `--b` anywhere; a scan of line starts alone would miss these.
        let hidden = b"Content-Type: multipart/mixed; BOUNDARY*=\"b\"\r\n\r\n\
x--b\r\n\r\n1 x--b\r\n\r\n2 x--b\r\n\r\n3 x--b\r\n\r\n4 x--b--\r\n";
        assert_eq!(
            prescan(hidden, &LIMITS).unwrap_err().over,
            OverLimit::Parts { limit: 3 }
        );
    }
}
