//! The shared SMTP sink's per-address runtime switches (`scripts/smtp_sink.py`): a file
//! `<services dir>/smtp-fail/<address>` makes RCPT to that address answer the file's first
//! line; a file `<services dir>/smtp-delay/<address>` holds back the answer to the final "."
//! of a mail to it by the file's number of seconds (the mail is delivered at once). The sink
//! reads them on every command, so they act at once, and only on the one address: the
//! scenarios name their own unique sender (the host's replies go to it), so the shared sink
//! stays safe for everyone else.

use std::path::PathBuf;

use anyhow::Context;

/// One switch file, removed when the value is dropped (also when the scenario fails).
#[derive(Debug)]
pub struct SinkSwitch {
    path: PathBuf,
}

impl SinkSwitch {
    /// RCPT to `address`'s local part is answered `reply` (e.g. `451 4.3.0 try later`).
    pub fn fail(local_part: &str, reply: &str) -> anyhow::Result<Self> {
        Self::write("smtp-fail", local_part, reply)
    }

    /// The answer to the final "." of a mail to `local_part` comes `secs` seconds late.
    pub fn delay(local_part: &str, secs: u64) -> anyhow::Result<Self> {
        Self::write("smtp-delay", local_part, &secs.to_string())
    }

    fn write(folder: &str, local_part: &str, line: &str) -> anyhow::Result<Self> {
        let dir = worker_testkit::services_dir().join(folder);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // The sink matches the bare local part too, lower-cased; it ignores names starting
        // with a dot, so the file is written whole under such a name and then renamed.
        let name = local_part.to_lowercase();
        let path = dir.join(&name);
        let staging = dir.join(format!(".{name}.tmp"));
        std::fs::write(&staging, format!("{line}\n"))
            .with_context(|| format!("writing {}", staging.display()))?;
        std::fs::rename(&staging, &path)
            .with_context(|| format!("renaming {} to {}", staging.display(), path.display()))?;
        Ok(Self { path })
    }
}

impl Drop for SinkSwitch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
