//! `worker-host config check`: prints the effective settings, secrets redacted, then exits.
//! Loading them has validated them already.

use crate::settings::{Settings, SettingsSource};

#[derive(Debug, clap::Subcommand)]
pub enum ConfigAction {
    /// Validate the settings, then print the effective settings with every secret redacted.
    Check,
}

pub fn check(settings: &Settings, source: &SettingsSource) {
    println!(
        "# effective settings ({}), secrets redacted",
        source.path.display()
    );
    print!("{}", settings.to_redacted_toml());
    for note in settings.notes() {
        println!("# note: {note}");
    }
}
