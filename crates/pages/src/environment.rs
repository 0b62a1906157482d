//! An installation's environment (`production`, `staging`, ...): the band on every page of its
//! console (`admin.environment`), on `/status` for the fleet view, and the fleet view's label
//! of each installation. The colour is a class of the stylesheet, never an inline style: the
//! pages' Content-Security-Policy allows no style but `/console.css`.

use serde::{Deserialize, Serialize};

/// The longest environment name taken: it is a label, shown in a band and a table cell.
pub const NAME_MAX_CHARS: usize = 40;

/// The band's colours, each a class `env-<colour>` of the stylesheet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Colour {
    Red,
    Amber,
    Blue,
    Green,
    Grey,
}

/// The names taken as production: marked red unless a colour is set.
const PRODUCTION_NAMES: &[&str] = &["production", "prod", "prd", "live"];

/// An environment as pages and `/status` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Environment {
    pub name: String,
    pub colour: Colour,
    /// A production environment: its pages say so in words, not only by the colour.
    pub production: bool,
}

impl Environment {
    /// `name` coloured `colour`, or red for a production name and blue for any other.
    pub fn new(name: &str, colour: Option<Colour>) -> Self {
        let name = name.trim().to_string();
        let production = is_production(&name);
        let colour = colour.unwrap_or(if production {
            Colour::Red
        } else {
            Colour::Blue
        });
        Self {
            name,
            colour,
            production,
        }
    }
}

/// Whether `name` names a production environment (`Production`, `prod`, `live`, ...).
pub fn is_production(name: &str) -> bool {
    let name = name.trim();
    PRODUCTION_NAMES
        .iter()
        .any(|p| p.eq_ignore_ascii_case(name))
}

/// What is wrong with `name` as an environment's name, if anything.
pub fn check_name(name: &str) -> Result<(), String> {
    let trimmed = name.trim();
    if trimmed.is_empty() {
        return Err(
            "expected the environment's name (`production`, `staging`, ...), found an empty string"
                .into(),
        );
    }
    if trimmed.chars().count() > NAME_MAX_CHARS {
        return Err(format!(
            "expected a short label of at most {NAME_MAX_CHARS} characters, found {}",
            trimmed.chars().count()
        ));
    }
    if trimmed.chars().any(char::is_control) {
        return Err("expected a label without control characters".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn production_is_red_and_said_in_words_unless_a_colour_is_set() {
        let prod = Environment::new("Production", None);
        assert_eq!(prod.colour, Colour::Red);
        assert!(prod.production);
        let staging = Environment::new("staging", None);
        assert_eq!(staging.colour, Colour::Blue);
        assert!(!staging.production);
        assert_eq!(
            Environment::new("live", Some(Colour::Amber)).colour,
            Colour::Amber
        );
    }

    #[test]
    fn an_empty_or_long_name_is_refused() {
        assert!(check_name(" ").is_err());
        assert!(check_name(&"x".repeat(NAME_MAX_CHARS + 1)).is_err());
        assert!(check_name("staging").is_ok());
    }
}
