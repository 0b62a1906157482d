//! Embeds the git revision the binary is built from as `WORKER_HOST_REVISION` (`worker-host
//! --version`, `/status`, the `worker_build_info` metric, the image's labels).
//!
//! Where the source has no git history (a tarball, an image build that copies no `.git`), the
//! builder passes it in the environment variable of the same name; otherwise it is `unknown`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=WORKER_HOST_REVISION");
    let given = std::env::var("WORKER_HOST_REVISION")
        .ok()
        .filter(|r| !r.trim().is_empty());
    let revision = given
        .clone()
        .or_else(|| git(&["rev-parse", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=WORKER_HOST_REVISION={revision}");
    if given.is_some() {
        return;
    }
    // Built again when HEAD moves: a new commit, a checkout, or refs packed.
    if let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo:rerun-if-changed={git_dir}/HEAD");
    }
    if let Some(common) = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]) {
        // Only a file that exists: cargo reruns a build script for ever over a missing one.
        let packed = format!("{common}/packed-refs");
        if std::path::Path::new(&packed).exists() {
            println!("cargo:rerun-if-changed={packed}");
        }
        // A commit writes the branch's loose ref (cargo scans a folder for any change).
        let heads = format!("{common}/refs/heads");
        if std::path::Path::new(&heads).is_dir() {
            println!("cargo:rerun-if-changed={heads}");
        }
    }
}
