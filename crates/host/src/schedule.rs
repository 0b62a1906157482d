//! Timer schedules: when each timer job ticks.

use croner::Cron;
use croner::parser::{CronParser, Seconds};

/// Parses a cron expression with five or six fields (seconds optional).
pub fn parse_cron(expression: &str) -> Result<Cron, croner::errors::CronError> {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .build()
        .parse(expression)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_and_six_field_expressions_parse_and_nonsense_does_not() {
        assert!(parse_cron("*/5 * * * *").is_ok());
        assert!(parse_cron("0 */5 * * * *").is_ok());
        assert!(parse_cron("every five minutes").is_err());
        assert!(parse_cron("61 * * * *").is_err());
    }
}
