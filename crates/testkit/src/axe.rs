//! Accessibility checks in the browser: axe-core (from the npm registry, installed by
//! `scripts/test.sh` into `crates/testkit/axe/node_modules`) run in the page a [`Browser`]
//! shows, and a check that the page fits a narrow window without scrolling sideways.
//!
//! The script is handed to the browser through WebDriver's execute-script, which the page's
//! Content-Security-Policy does not govern: the console's pages themselves stay script-free.

use std::path::PathBuf;

use anyhow::{Context, bail};
use serde::Deserialize;

use crate::Browser;

/// The impacts that fail a check: axe's own scale is minor, moderate, serious, critical.
pub const FAILING_IMPACTS: &[&str] = &["serious", "critical"];

/// One rule a page broke, with the elements that broke it.
#[derive(Debug, Clone, Deserialize)]
pub struct Violation {
    pub id: String,
    pub impact: Option<String>,
    pub help: String,
    #[serde(default)]
    pub nodes: Vec<ViolationNode>,
}

/// An element that broke a rule.
#[derive(Debug, Clone, Deserialize)]
pub struct ViolationNode {
    /// The CSS selectors axe gives for the element.
    pub target: Vec<serde_json::Value>,
    #[serde(default, rename = "failureSummary")]
    pub failure_summary: Option<String>,
}

impl Violation {
    /// Whether this violation fails a check ([`FAILING_IMPACTS`]).
    pub fn fails(&self) -> bool {
        self.impact
            .as_deref()
            .is_some_and(|impact| FAILING_IMPACTS.contains(&impact))
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let impact = self.impact.as_deref().unwrap_or("unrated");
        write!(f, "{} ({impact}): {}", self.id, self.help)?;
        for node in &self.nodes {
            let target: Vec<String> = node.target.iter().map(|t| t.to_string()).collect();
            write!(f, "\n    at {}", target.join(" "))?;
            if let Some(summary) = &node.failure_summary {
                write!(f, ": {}", summary.replace('\n', " "))?;
            }
        }
        Ok(())
    }
}

/// Where `npm ci` put axe-core.
fn axe_script_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("axe/node_modules/axe-core/axe.min.js")
}

/// axe-core's script, or an error that says how to install it.
fn axe_script() -> anyhow::Result<String> {
    let path = axe_script_path();
    std::fs::read_to_string(&path).with_context(|| {
        format!(
            "reading {} (axe-core): `npm ci --prefix crates/testkit/axe` installs it, as scripts/test.sh does",
            path.display()
        )
    })
}

/// Runs axe in the callback form WebDriver's execute-async wants.
const RUN_AXE: &str = r#"
const done = arguments[arguments.length - 1];
axe.run(document, { resultTypes: ["violations"] })
  .then(results => done(JSON.stringify(results.violations)))
  .catch(error => done(JSON.stringify({ error: String(error) })));
"#;

/// What the page's width is against the window's.
const WIDTHS: &str = r#"
return [document.documentElement.scrollWidth, window.innerWidth];
"#;

impl Browser {
    /// Every axe-core violation on the page now shown, of any impact.
    pub async fn axe_violations(&self) -> anyhow::Result<Vec<Violation>> {
        let script = axe_script()?;
        self.client
            .execute(&script, vec![])
            .await
            .context("loading axe-core into the page")?;
        let answer = self
            .client
            .execute_async(RUN_AXE, vec![])
            .await
            .context("running axe-core")?;
        let text = answer
            .as_str()
            .context("axe-core answered with something other than text")?;
        if let Ok(failure) =
            serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(text)
        {
            bail!("axe-core failed in the page: {:?}", failure.get("error"));
        }
        serde_json::from_str(text).context("reading axe-core's violations")
    }

    /// Fails, naming each, when the page shown has a serious or critical violation.
    pub async fn assert_accessible(&self, page: &str) -> anyhow::Result<()> {
        let failing: Vec<Violation> = self
            .axe_violations()
            .await?
            .into_iter()
            .filter(Violation::fails)
            .collect();
        if !failing.is_empty() {
            let list: Vec<String> = failing.iter().map(ToString::to_string).collect();
            bail!(
                "{page}: {} serious or critical accessibility violation(s):\n  {}",
                failing.len(),
                list.join("\n  ")
            );
        }
        Ok(())
    }

    /// Fails when the page shown is wider than the window, so that a reader would have to
    /// scroll sideways to see all of it (a table may scroll inside its own box).
    pub async fn assert_fits_width(&self, page: &str) -> anyhow::Result<()> {
        let answer = self.client.execute(WIDTHS, vec![]).await?;
        let widths: (u64, u64) = serde_json::from_value(answer)?;
        if widths.0 > widths.1 {
            bail!(
                "{page}: the page is {} px wide in a window of {} px",
                widths.0,
                widths.1
            );
        }
        Ok(())
    }

    /// Resizes the window (a phone is about 400 px wide).
    pub async fn resize(&self, width: u32, height: u32) -> anyhow::Result<()> {
        self.client
            .set_window_size(width, height)
            .await
            .context("resizing the window")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn violation(impact: Option<&str>) -> Violation {
        Violation {
            id: "color-contrast".into(),
            impact: impact.map(str::to_string),
            help: "Elements must meet minimum color contrast ratio thresholds".into(),
            nodes: vec![],
        }
    }

    #[test]
    fn serious_and_critical_violations_fail_a_check() {
        assert!(violation(Some("serious")).fails());
        assert!(violation(Some("critical")).fails());
    }

    #[test]
    fn minor_moderate_and_unrated_violations_do_not_fail_a_check() {
        assert!(!violation(Some("minor")).fails());
        assert!(!violation(Some("moderate")).fails());
        assert!(!violation(None).fails());
    }

    #[test]
    fn a_violation_reads_from_axe_cores_json() {
        let json = r#"[{"id":"label","impact":"critical","help":"Form elements must have labels",
            "nodes":[{"target":["input[name=search]"],"failureSummary":"Fix any of the following:\n  no label"}]}]"#;
        let violations: Vec<Violation> = serde_json::from_str(json).unwrap();
        assert_eq!(violations.len(), 1);
        let shown = violations[0].to_string();
        assert!(shown.contains("label (critical)"), "{shown}");
        assert!(shown.contains("input[name=search]"), "{shown}");
    }
}
