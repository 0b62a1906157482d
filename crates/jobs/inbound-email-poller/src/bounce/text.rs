//! What a report's words say where it has no delivery-status fields (Google's, Microsoft's):
//! the status code in a server's answer, Google's "The response was:", Microsoft's
//! "Diagnostic information for administrators:", and the original's header quoted in the text.

/// The first RFC 3463 status code in `text` (`5.1.1`, `4.4.0`), standing alone.
pub(super) fn status_code(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let boundary = |i: usize| {
        bytes
            .get(i)
            .is_none_or(|b| !(b.is_ascii_digit() || *b == b'.'))
    };
    (0..bytes.len()).find_map(|start| {
        if !matches!(bytes[start], b'2' | b'4' | b'5') || (start > 0 && !boundary(start - 1)) {
            return None;
        }
        let mut end = start + 1;
        for _ in 0..2 {
            if bytes.get(end) != Some(&b'.') {
                return None;
            }
            let digits = bytes[end + 1..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            if !(1..=3).contains(&digits) {
                return None;
            }
            end += 1 + digits;
        }
        boundary(end).then(|| text[start..end].to_string())
    })
}

/// The paragraph after Google's "The response was:" (or, in its older shape, "The error
/// that the other server returned was:").
pub(super) fn google_diagnostic(body: &str) -> Option<String> {
    let lower = body.to_ascii_lowercase();
    let at = [
        "the response was:",
        "the error that the other server returned was:",
    ]
    .iter()
    .find_map(|marker| lower.find(marker).map(|i| i + marker.len()))?;
    paragraph(body.get(at..)?)
}

/// The recipients Microsoft's text lists under "Diagnostic information for administrators:",
/// each with what the remote server returned.
pub(super) fn microsoft_recipients(body: &str) -> Vec<(String, Option<String>)> {
    let lower = body.to_ascii_lowercase();
    let Some(start) = lower.find("diagnostic information for administrators:") else {
        return Vec::new();
    };
    let end = lower[start..]
        .find("original message headers:")
        .map_or(body.len(), |e| start + e);
    let mut found: Vec<(String, Option<String>)> = Vec::new();
    let mut open_diagnostic = false;
    for line in body[start..end].lines().skip(1).map(str::trim) {
        if line.is_empty() {
            open_diagnostic = false;
        } else if let Some(address) = bare_address(line) {
            found.push((address, None));
            open_diagnostic = false;
        } else if let Some((_, diagnostic)) = found.last_mut() {
            let lower = line.to_ascii_lowercase();
            if lower.starts_with("remote server returned") || line.starts_with('#') {
                *diagnostic = Some(line.to_string());
                open_diagnostic = true;
            } else if open_diagnostic && let Some(text) = diagnostic {
                text.push(' ');
                text.push_str(line);
            }
        }
    }
    for (_, diagnostic) in &mut found {
        if let Some(text) = diagnostic {
            let words = text
                .trim_start_matches("Remote Server returned")
                .trim_start_matches("Remote server returned")
                .trim()
                .trim_matches(['\'', '#'])
                .trim()
                .to_string();
            *text = words;
        }
    }
    found
}

/// The Message-ID in the original's header that the text quotes after "Original message
/// headers:" (Microsoft) or "----- Original message -----" (Gmail).
pub(super) fn quoted_message_id(body: &str) -> Option<String> {
    let lower = body.to_ascii_lowercase();
    let start = ["original message headers:", "----- original message -----"]
        .iter()
        .find_map(|marker| lower.find(marker))?;
    let mut lines = body[start..].lines().map(str::trim_end);
    while let Some(line) = lines.next() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if name.trim().eq_ignore_ascii_case("message-id") {
            let value = value.trim();
            let value = if value.is_empty() {
                lines.next().unwrap_or_default().trim()
            } else {
                value
            };
            return Some(value.to_string()).filter(|v| !v.is_empty());
        }
    }
    None
}

/// The lines of `text` from its first non-blank one to the next blank one, joined.
fn paragraph(text: &str) -> Option<String> {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .skip_while(|l| l.is_empty())
        .take_while(|l| !l.is_empty())
        .collect();
    (!lines.is_empty()).then(|| lines.join(" "))
}

/// `ann@example.com` or `Ann<mailto:ann@example.com>`, alone on its line.
fn bare_address(line: &str) -> Option<String> {
    let candidate = match line.split_once("<mailto:") {
        Some((_, rest)) => rest.trim_end_matches('>'),
        None => line,
    };
    let plausible = candidate.contains('@')
        && !candidate.contains(char::is_whitespace)
        && !candidate.contains(['<', '>', '\'', '(', ')']);
    plausible.then(|| candidate.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_code_is_found_standing_alone() {
        assert_eq!(
            status_code("550 5.1.1 <a@b>... User Unknown").as_deref(),
            Some("5.1.1")
        );
        assert_eq!(status_code("4.4.0 (other)").as_deref(), Some("4.4.0"));
        assert_eq!(
            status_code("see DSN 5.1.10 errors").as_deref(),
            Some("5.1.10")
        );
        assert_eq!(status_code("version 15.1.112.19 and 192.0.2.4"), None);
        assert_eq!(status_code("no code here"), None);
    }
}
