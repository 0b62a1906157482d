//! `worker-host config check`: prints the effective settings, secrets redacted, then exits.
//! Loading them has validated them already. With `database.hosts`, it also asks each member
//! whether it is the primary.

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
    if settings.database.hosts.is_some() {
        print_members(settings);
    }
}

/// Each member of `database.hosts` and what it answers now: the primary, a standby, or
/// unreachable (each asked at once, within a few seconds).
fn print_members(settings: &Settings) {
    let options = crate::connections::pool_options(&settings.database);
    let answers = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(worker_store::primary::ask_each(
            &options.connect,
            &options.members,
        )),
        Err(e) => {
            println!("# database.hosts: the members could not be asked: {e}");
            return;
        }
    };
    println!("# database.hosts, asked now (the host writes to the first that takes writes):");
    for answer in answers {
        println!("#   {}: {}", answer.member, answer.role);
    }
}
