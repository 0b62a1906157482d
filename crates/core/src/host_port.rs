//! A server's `host:port` as operators write it in a list of addresses (a broker cluster's
//! nodes, a database's members): an IPv6 address in brackets (`[::1]:5432`), the host kept
//! exactly as written (with TLS, the server's certificate must name it).
//!
//! ```
//! use worker_core::host_port::{self, Malformed};
//!
//! assert_eq!(host_port::split(" db-a:5432 "), Ok(("db-a", 5432)));
//! assert_eq!(host_port::split("[::1]:5432"), Ok(("::1", 5432)));
//! assert_eq!(host_port::split("::1:5432"), Err(Malformed::NotHostPort));
//! assert_eq!(host_port::split(":5432"), Err(Malformed::EmptyHost));
//! assert_eq!(host_port::split("db-a:0"), Err(Malformed::BadPort));
//! assert_eq!(host_port::shown("::1", 5432).to_string(), "[::1]:5432");
//! ```

use std::fmt;

/// What is wrong with a text that should be `host:port`; each caller words it for its own
/// servers (their usual port in the example).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    /// No port, or an IPv6 address without brackets (which cannot be told from its port).
    NotHostPort,
    /// Nothing before the port, or a host with a space in it.
    EmptyHost,
    /// Not a port number from 1 to 65535.
    BadPort,
}

/// The host (an IPv6 one without its brackets) and the port of `text`, trimmed.
pub fn split(text: &str) -> Result<(&str, u16), Malformed> {
    let trimmed = text.trim();
    let (host, port) = match trimmed.strip_prefix('[') {
        Some(rest) => {
            let (host, after) = rest.split_once(']').ok_or(Malformed::NotHostPort)?;
            (host, after.strip_prefix(':').ok_or(Malformed::NotHostPort)?)
        }
        None => {
            let (host, port) = trimmed.rsplit_once(':').ok_or(Malformed::NotHostPort)?;
            // An unbracketed IPv6 address cannot be told from its port.
            if host.contains(':') {
                return Err(Malformed::NotHostPort);
            }
            (host, port)
        }
    };
    if host.is_empty() || host.chars().any(char::is_whitespace) {
        return Err(Malformed::EmptyHost);
    }
    match port.parse::<u16>() {
        Ok(port) if port > 0 => Ok((host, port)),
        _ => Err(Malformed::BadPort),
    }
}

/// `host` and `port` as they are written back: `host:port`, an IPv6 host in brackets.
pub fn shown(host: &str, port: u16) -> impl fmt::Display + '_ {
    Shown { host, port }
}

struct Shown<'a> {
    host: &'a str,
    port: u16,
}

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}
