//! The previous release's `worker-host`, for the `rolling-upgrade` scenario: the commit that
//! `docs/previous-release` names, built in a git worktree of its own under
//! `target/faults/previous-release/<commit>/` (the worktree in `src/`, its cargo target in
//! `target/`, the build's output in `build.log`) and reused while its binary is there. A cold
//! build takes minutes, so only the scenario that needs it (a full run's) asks for it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// The repository this harness was built from.
const REPOSITORY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// How long a cold build may take before the scenario gives up on it (on two shared cores a
/// cold debug build of the workspace's host takes several minutes).
const BUILD_WAIT: Duration = Duration::from_secs(40 * 60);

/// The previous release's binary, ready to run.
#[derive(Debug, Clone)]
pub struct PreviousRelease {
    /// The commit it was built from (the full id).
    pub commit: String,
    pub binary: PathBuf,
    /// Where the build's output went (kept when the binary was reused).
    pub build_log: PathBuf,
    /// Seconds the build took now, `None` when an earlier build's binary was reused.
    pub build_secs: Option<f64>,
}

/// The commit `docs/previous-release` names: its first line that is not a comment.
pub fn commit_of(text: &str) -> anyhow::Result<String> {
    let line = text
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with('#'))
        .context("docs/previous-release names no commit")?;
    if line.len() < 7 || !line.chars().all(|c| c.is_ascii_hexdigit()) {
        bail!("docs/previous-release: {line:?} is not a commit id");
    }
    Ok(line.to_string())
}

/// Builds (or reuses) the previous release's `worker-host`.
pub async fn ensure() -> anyhow::Result<PreviousRelease> {
    // Canonical, so that the paths the report names have no `..` in them.
    let repository = std::fs::canonicalize(REPOSITORY).context("resolving the repository")?;
    let named = repository.join("docs/previous-release");
    let text =
        std::fs::read_to_string(&named).with_context(|| format!("reading {}", named.display()))?;
    let short = commit_of(&text)?;
    // The full id, so that one commit has one folder however it is written.
    let commit = git_output(
        &repository,
        &["rev-parse", "--verify", &format!("{short}^{{commit}}")],
    )
    .await
    .with_context(|| format!("docs/previous-release names {short}, which git does not know"))?;
    let folder = repository
        .join("target/faults/previous-release")
        .join(&commit);
    let binary = folder.join("target/debug/worker-host");
    let build_log = folder.join("build.log");
    if binary.exists() {
        return Ok(PreviousRelease {
            commit,
            binary,
            build_log,
            build_secs: None,
        });
    }
    std::fs::create_dir_all(&folder).with_context(|| format!("creating {}", folder.display()))?;
    let source = folder.join("src");
    let started = Instant::now();
    eprintln!(
        "faults: building the previous release {commit} (minutes when cold; log {})",
        build_log.display()
    );
    if !source.join("Cargo.toml").exists() {
        // A folder left by an interrupted run is not a worktree git knows: start it over.
        let _ = git_output(&repository, &["worktree", "prune"]).await;
        let _ = std::fs::remove_dir_all(&source);
        git_output(
            &repository,
            &[
                "worktree",
                "add",
                "--detach",
                &source.display().to_string(),
                &commit,
            ],
        )
        .await
        .context("adding a worktree of the previous release")?;
    }
    let built = build(&source, &folder.join("target"), &build_log).await;
    // The binary stays in the target folder; the worktree is needed only for the build.
    let removed = git_output(
        &repository,
        &[
            "worktree",
            "remove",
            "--force",
            &source.display().to_string(),
        ],
    )
    .await;
    built?;
    removed.context("removing the previous release's worktree")?;
    anyhow::ensure!(
        binary.exists(),
        "the build of {commit} made no {}",
        binary.display()
    );
    Ok(PreviousRelease {
        commit,
        binary,
        build_log,
        build_secs: Some(started.elapsed().as_secs_f64()),
    })
}

/// `path` as the report shows it: relative to the repository when inside it (the report is
/// kept in the repository, where an absolute path names one machine's checkout).
pub fn shown(path: &Path) -> String {
    std::fs::canonicalize(REPOSITORY)
        .ok()
        .and_then(|repository| path.strip_prefix(repository).ok().map(Path::to_path_buf))
        .unwrap_or_else(|| path.to_path_buf())
        .display()
        .to_string()
}

/// The first line of `binary --version` (the release and the git revision it was built
/// from), or what went wrong.
pub fn version_of(binary: &Path) -> String {
    match std::process::Command::new(binary).arg("--version").output() {
        Ok(output) => String::from_utf8_lossy(&output.stdout)
            .lines()
            .next()
            .unwrap_or("no version")
            .trim()
            .to_string(),
        Err(err) => format!("no version ({err})"),
    }
}

/// `cargo build -p worker-host` in `source` with its own target folder, its output to `log`.
async fn build(source: &Path, target: &Path, log: &Path) -> anyhow::Result<()> {
    let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    let mut command = tokio::process::Command::new("cargo");
    command
        .args(["build", "--locked", "-p", "worker-host"])
        .current_dir(source)
        .env("CARGO_TARGET_DIR", target)
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true);
    let status = tokio::time::timeout(BUILD_WAIT, command.status())
        .await
        .with_context(|| format!("the build did not finish within {BUILD_WAIT:?}"))?
        .context("running cargo")?;
    if !status.success() {
        bail!(
            "cargo build of the previous release: {status} (log {})",
            log.display()
        );
    }
    Ok(())
}

/// `git args` in `repository`; its standard output, trimmed.
async fn git_output(repository: &Path, args: &[&str]) -> anyhow::Result<String> {
    let output = tokio::process::Command::new("git")
        .arg("-C")
        .arg(repository)
        .args(args)
        .output()
        .await
        .context("running git")?;
    if !output.status.success() {
        bail!(
            "git {args:?}: {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_commit_is_the_first_line_that_is_not_a_comment() {
        let text = "# the release before\n\n0b72d47abc5448081067642ef100b7baa1c56d6a\n";
        assert_eq!(
            commit_of(text).unwrap(),
            "0b72d47abc5448081067642ef100b7baa1c56d6a"
        );
        assert!(commit_of("# nothing\n").is_err());
        assert!(commit_of("main\n").is_err());
        assert!(commit_of("0b72\n").is_err());
    }
}
