//! The README is the front door and `docs/` holds the reference: every relative link between
//! them must lead somewhere. A link `[text](path)` or `![alt](path)` in README.md or in any
//! `docs/**/*.md` must name a file or folder that exists (relative to the file it is in), and
//! `[text](path#anchor)` or `[text](#anchor)` a heading of that Markdown file, by GitHub's
//! slug rules (lower-case, punctuation dropped, spaces to hyphens, `-1`, `-2` for repeats).
//! External links (`http://`, `https://`, `mailto:`) are not fetched. Links inside code
//! (fenced blocks and backtick spans) are text, not links.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The README's most lines: a front door, not the reference.
const README_MAX_LINES: usize = 250;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// README.md and every Markdown file under docs/, sorted.
fn documents(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                found.push(path);
            }
        }
    }
    let mut found = vec![root.join("README.md")];
    walk(&root.join("docs"), &mut found);
    found.sort();
    found
}

/// A line's text with its code spans blanked out (a run of n backticks opens a span that only
/// a run of exactly n closes), so that `[a](b)` written as code is not taken for a link.
fn without_code_spans(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|c| **c == '`').count();
        // Find the closing run of the same length.
        let mut j = i + run;
        let mut closed = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let len = chars[j..].iter().take_while(|c| **c == '`').count();
                if len == run {
                    closed = Some(j + len);
                    break;
                }
                j += len;
            } else {
                j += 1;
            }
        }
        match closed {
            Some(end) => {
                out.push(' ');
                i = end;
            }
            None => {
                // An unclosed run is literal text.
                out.extend(std::iter::repeat_n('`', run));
                i += run;
            }
        }
    }
    out
}

/// The lines of a Markdown text that are not inside a fenced code block, with their numbers
/// (from 1).
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = if trimmed.starts_with("```") {
            Some("```")
        } else if trimmed.starts_with("~~~") {
            Some("~~~")
        } else {
            None
        };
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m => fence = None,
            (Some(_), _) => {}
            (None, None) => lines.push((index + 1, line)),
        }
    }
    lines
}

/// Every inline link's `(text, target)` on one line of prose.
fn links_on(line: &str) -> Vec<(String, String)> {
    let line = without_code_spans(line);
    let mut links = Vec::new();
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let before = &rest[..at];
        let text = before
            .rfind('[')
            .map(|open| before[open + 1..].to_string())
            .unwrap_or_default();
        let after = &rest[at + 2..];
        let end = after
            .find(|c: char| c == ')' || c.is_whitespace())
            .unwrap_or(after.len());
        let target = after[..end].trim_matches(|c| c == '<' || c == '>');
        if before.contains('[') && !target.is_empty() {
            links.push((text, target.to_string()));
        }
        rest = &after[end..];
    }
    links
}

/// GitHub's anchor for a heading: markup dropped, lower-case, every character that is not a
/// letter, digit, space, hyphen or underscore dropped, spaces to hyphens.
fn slug(heading: &str) -> String {
    // `[text](url)` in a heading is linked as its text.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        match rest[open..].find("](") {
            Some(mid) => {
                let close = rest[open + mid..].find(')').map(|c| open + mid + c);
                match close {
                    Some(close) => {
                        text.push_str(&rest[..open]);
                        text.push_str(&rest[open + 1..open + mid]);
                        rest = &rest[close + 1..];
                    }
                    None => break,
                }
            }
            None => break,
        }
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's ATX headings, repeats numbered as GitHub does.
fn anchors(text: &str) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = Vec::new();
    for (_, line) in prose_lines(text) {
        let trimmed = line.trim_start();
        let level = trimmed.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&level) || !trimmed[level..].starts_with(' ') {
            continue;
        }
        let heading = trimmed[level..].trim().trim_end_matches('#').trim();
        let base = slug(heading);
        let count = seen.entry(base.clone()).or_insert(0);
        anchors.push(if *count == 0 {
            base.clone()
        } else {
            format!("{base}-{count}")
        });
        *count += 1;
    }
    anchors
}

fn is_external(target: &str) -> bool {
    ["http://", "https://", "mailto:", "ftp://"]
        .iter()
        .any(|scheme| target.starts_with(scheme))
}

/// Why a link does not resolve, or None when it does.
fn broken(document: &Path, target: &str) -> Option<String> {
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let path = path.replace("%20", " ");
    let file = if path.is_empty() {
        document.to_path_buf()
    } else {
        document.parent().unwrap().join(&path)
    };
    if !file.exists() {
        return Some(format!("no file {path}"));
    }
    let anchor = anchor?;
    if file.is_dir() || file.extension().is_none_or(|ext| ext != "md") {
        return Some(format!("#{anchor} on a file that is not Markdown"));
    }
    let text = std::fs::read_to_string(&file).unwrap();
    let anchors = anchors(&text);
    if anchors.iter().any(|a| a == anchor) {
        None
    } else {
        Some(format!("no heading #{anchor} in {}", file_name(&file)))
    }
}

fn file_name(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn every_relative_link_in_the_readme_and_docs_resolves() {
    let root = root();
    let mut checked = 0;
    let mut problems = Vec::new();
    for document in documents(&root) {
        let text = std::fs::read_to_string(&document).unwrap();
        for (number, line) in prose_lines(&text) {
            for (text, target) in links_on(line) {
                if is_external(&target) {
                    continue;
                }
                checked += 1;
                if let Some(why) = broken(&document, &target) {
                    problems.push(format!(
                        "{}:{number}: [{text}]({target}): {why}",
                        file_name(&document)
                    ));
                }
            }
        }
    }
    assert!(checked > 0, "no relative link found at all");
    assert!(
        problems.is_empty(),
        "{} of {checked} relative links do not resolve:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_readme_is_a_front_door_of_at_most_250_lines() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move reference text to docs/"
    );
}

/// "Where to go next": each reference file in docs/ is reachable from the README.
#[test]
fn the_readme_links_every_reference_file_in_docs() {
    let root = root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let linked: Vec<String> = prose_lines(&readme)
        .into_iter()
        .flat_map(|(_, line)| links_on(line))
        .map(|(_, target)| target.split('#').next().unwrap().to_string())
        .collect();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|ext| ext == "md") {
            let relative = format!("docs/{}", path.file_name().unwrap().to_string_lossy());
            if !linked.contains(&relative) {
                missing.push(relative);
            }
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "README.md links none of: {}",
        missing.join(", ")
    );
}

#[test]
fn headings_are_anchored_by_githubs_slug_rules() {
    assert_eq!(slug("The two commands"), "the-two-commands");
    assert_eq!(
        slug("The environment's band (`admin.environment`)"),
        "the-environments-band-adminenvironment"
    );
    assert_eq!(
        slug("Mailboxes that take a token: Microsoft 365 and Google Workspace"),
        "mailboxes-that-take-a-token-microsoft-365-and-google-workspace"
    );
    assert_eq!(slug("WorkerHostBounceRate"), "workerhostbouncerate");
    assert_eq!(
        slug("See [the runbook](RUNBOOK.md) now"),
        "see-the-runbook-now"
    );
    assert_eq!(
        anchors("# A\n\n```\n# not a heading\n```\n## A\n### B b\n"),
        vec!["a", "a-1", "b-b"]
    );
}

#[test]
fn links_written_as_code_are_not_links() {
    assert_eq!(
        links_on("see [the runbook](docs/RUNBOOK.md#a) and `[x](nowhere.md)`"),
        vec![("the runbook".to_string(), "docs/RUNBOOK.md#a".to_string())]
    );
    assert_eq!(
        links_on("![The overview](docs/console/overview.png)"),
        vec![(
            "The overview".to_string(),
            "docs/console/overview.png".to_string()
        )]
    );
    assert!(links_on("``a `[x](y)` b``").is_empty());
}
