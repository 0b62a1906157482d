//! Bounding texts that are stored or sent: error messages, headers, previews.

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
}
