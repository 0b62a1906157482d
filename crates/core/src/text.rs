//! Bounding texts that are stored or sent: error messages, headers, previews; and showing
//! untrusted text on a terminal without letting it act there ([`visible`]).

use std::borrow::Cow;
use std::fmt::Write as _;

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
pub fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Whether a terminal (or the reader's eye) would act on `c` rather than show it: C0 controls,
/// DEL, C1 controls (U+0080..U+009F, CSI and OSC among them), and the characters that reorder
/// text (bidi embeddings, overrides, isolates and marks, and the line and paragraph
/// separators), which make a listing read other than it is.
fn acts(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// `text`, from a mail or a dead letter (a subject, a sender, an SMTP server's error), as one
/// line a terminal shows and never acts on: each character [`acts`] on written as an escape
/// (`\n`, `\t`, `\r`, else `\u{1b}`), so that a subject carrying `ESC ] 0;...BEL` or
/// `ESC [2J` cannot retitle, clear or write the clipboard of an operator's terminal.
/// Borrowed when there is nothing to escape.
pub fn visible(text: &str) -> Cow<'_, str> {
    if !text.chars().any(acts) {
        return Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\n' => shown.push_str("\\n"),
            '\t' => shown.push_str("\\t"),
            '\r' => shown.push_str("\\r"),
            c if acts(c) => {
                let _ = write!(shown, "\\u{{{:x}}}", u32::from(c));
            }
            c => shown.push(c),
        }
    }
    Cow::Owned(shown)
}

/// JSON text (as `serde_json` writes it) with the characters it leaves raw and a terminal
/// acts on (DEL, C1 controls, bidi) written as `\uXXXX` escapes: still the same JSON, since
/// they can only be inside its strings. (`serde_json` escapes C0 controls, ESC among them,
/// itself.)
pub fn visible_json(json: &str) -> Cow<'_, str> {
    // A raw line break is the pretty form's, between values: serde_json escapes one in a string.
    let raw = |c: char| acts(c) && c != '\n';
    if !json.chars().any(raw) {
        return Cow::Borrowed(json);
    }
    let mut shown = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if raw(c) {
            let _ = write!(shown, "\\u{:04x}", u32::from(c));
        } else {
            shown.push(c);
        }
    }
    Cow::Owned(shown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_text_is_kept_whole() {
        assert_eq!(truncate("abc", 3), "abc");
    }

    #[test]
    fn a_cut_never_splits_a_character() {
        // "é" is two bytes: a cut at 2 would fall inside it.
        assert_eq!(truncate("aé", 2), "a");
        assert_eq!(truncate("aé", 3), "aé");
        assert_eq!(truncate("€", 1), "");
    }

    #[test]
    fn escapes_a_terminal_acts_on_are_shown_not_sent() {
        assert_eq!(
            visible("a\u{1b}]0;title\u{7}b\u{1b}[2J"),
            "a\\u{1b}]0;title\\u{7}b\\u{1b}[2J"
        );
        assert_eq!(visible("\u{9b}31m\u{7f}"), "\\u{9b}31m\\u{7f}");
        assert_eq!(visible("x\u{202e}exe.txt"), "x\\u{202e}exe.txt");
        assert_eq!(visible("two\nlines\tand\r"), "two\\nlines\\tand\\r");
    }

    #[test]
    fn plain_text_is_borrowed_as_it_is() {
        assert!(matches!(
            visible("Re: ping — ça va? 日本"),
            Cow::Borrowed("Re: ping — ça va? 日本")
        ));
    }

    #[test]
    fn json_keeps_its_meaning_and_loses_what_a_terminal_acts_on() {
        let value = serde_json::json!({"subject": "a\u{1b}b\u{9b}c\u{7f}d\u{202e}e"});
        let text = serde_json::to_string_pretty(&value).unwrap();
        let shown = visible_json(&text);
        assert!(!shown.chars().any(|c| acts(c) && c != '\n'), "{shown}");
        let back: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(back, value);
    }
}
