//! Where RabbitMQ answers: a node's [`BrokerAddress`] (`host:port`), and the [`Rotation`]
//! that decides which of a cluster's addresses a client tries next.
//!
//! A cluster is reached through any of its nodes. The list is tried in the order given; a
//! node that refuses the connection, times out or drops a live one is moved past, so that the
//! next try goes to the next node instead of waiting for the lost one to come back (a
//! RabbitMQ node that is stopped for an upgrade stays away for minutes).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use worker_core::host_port::{self, Malformed};

/// One node's AMQP listener: a host name or IP address and a port.
///
/// Written `host:port`, an IPv6 address in brackets (`[::1]:5672`). With TLS the server's
/// certificate must name `host`, so the host is kept exactly as written.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BrokerAddress {
    /// A host name or IP address (an IPv6 one without brackets), as the certificate names it.
    pub host: String,
    /// The AMQP (or AMQPS) port.
    pub port: u16,
}

impl BrokerAddress {
    /// The address of `host` at `port`.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        Self {
            host: host.into(),
            port,
        }
    }
}

impl fmt::Display for BrokerAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        host_port::shown(&self.host, self.port).fmt(f)
    }
}

/// Why a text is not a `host:port` address. Each variant quotes the text: an address is not
/// a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("expected `host:port` (an IPv6 address as `[::1]:5672`), found `{0}`")]
    NotHostPort(String),
    #[error("expected a host before the port, found `{0}`")]
    EmptyHost(String),
    #[error("expected a port number from 1 to 65535 after the host, found `{0}`")]
    BadPort(String),
}

impl FromStr for BrokerAddress {
    type Err = AddressError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match host_port::split(text) {
            Ok((host, port)) => Ok(Self::new(host, port)),
            Err(Malformed::NotHostPort) => Err(AddressError::NotHostPort(text.into())),
            Err(Malformed::EmptyHost) => Err(AddressError::EmptyHost(text.into())),
            Err(Malformed::BadPort) => Err(AddressError::BadPort(text.into())),
        }
    }
}

impl Serialize for BrokerAddress {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for BrokerAddress {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The order a client tries a list of addresses in: a cursor over the list, as a ring.
///
/// A reconnect is one [`pass`](Self::pass): every address once, from the cursor on, until
/// one connects. Each address that fails to connect, and the address of a connection that
/// was lost, is [`left`](Self::leave): the cursor moves past it, so the next try goes to the
/// next node. A connection that lasts keeps the cursor where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rotation {
    len: usize,
    next: usize,
}

impl Rotation {
    /// A rotation over `len` addresses, starting at the first.
    pub fn new(len: usize) -> Self {
        Self { len, next: 0 }
    }

    /// The index the next try goes to (0 when there are no addresses).
    pub fn next(&self) -> usize {
        self.next
    }

    /// The indexes of one pass, in order: each address once, from the cursor on, wrapping
    /// around. Taken before the pass starts, so that [`leave`](Self::leave) during it does
    /// not change it.
    pub fn pass(&self) -> Vec<usize> {
        (0..self.len).map(|i| (self.next + i) % self.len).collect()
    }

    /// The address at `index` failed or went away: the next try starts at the one after.
    pub fn leave(&mut self, index: usize) {
        if self.len > 0 {
            self.next = (index % self.len + 1) % self.len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_read_and_written_as_host_port() {
        for (text, host, port) in [
            ("127.0.0.1:5672", "127.0.0.1", 5672),
            ("mq-1.example.com:5671", "mq-1.example.com", 5671),
            (" localhost:5673 ", "localhost", 5673),
            ("[::1]:5672", "::1", 5672),
        ] {
            let address: BrokerAddress = text.parse().unwrap();
            assert_eq!(address, BrokerAddress::new(host, port), "{text}");
            assert_eq!(address.to_string(), text.trim(), "{text}");
        }
    }

    #[test]
    fn what_is_not_host_port_is_refused_saying_why() {
        for (text, expected) in [
            (
                "mq.example.com",
                AddressError::NotHostPort("mq.example.com".into()),
            ),
            ("::1:5672", AddressError::NotHostPort("::1:5672".into())),
            ("[::1]5672", AddressError::NotHostPort("[::1]5672".into())),
            (":5672", AddressError::EmptyHost(":5672".into())),
            ("mq one:5672", AddressError::EmptyHost("mq one:5672".into())),
            ("mq:0", AddressError::BadPort("mq:0".into())),
            ("mq:65536", AddressError::BadPort("mq:65536".into())),
            ("mq:amqp", AddressError::BadPort("mq:amqp".into())),
        ] {
            assert_eq!(text.parse::<BrokerAddress>(), Err(expected), "{text}");
        }
    }

    #[test]
    fn addresses_round_trip_through_toml_as_text() {
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct List {
            addresses: Vec<BrokerAddress>,
        }
        let list = List {
            addresses: vec![BrokerAddress::new("a", 1), BrokerAddress::new("::1", 2)],
        };
        let text = toml::to_string(&list).unwrap();
        assert_eq!(text, "addresses = [\"a:1\", \"[::1]:2\"]\n");
        assert_eq!(toml::from_str::<List>(&text).unwrap(), list);
        assert!(toml::from_str::<List>("addresses = [\"a\"]").is_err());
    }

    #[test]
    fn a_pass_tries_every_address_once_from_the_cursor() {
        let mut rotation = Rotation::new(3);
        assert_eq!(rotation.pass(), [0, 1, 2]);
        rotation.leave(0);
        assert_eq!(rotation.pass(), [1, 2, 0]);
        rotation.leave(2);
        assert_eq!(rotation.pass(), [0, 1, 2]);
    }

    #[test]
    fn a_lost_connection_sends_the_next_try_to_the_next_node() {
        // Connected to the first node; it goes away: the reconnect starts at the second.
        let mut rotation = Rotation::new(3);
        let connected = rotation.pass()[0];
        rotation.leave(connected);
        assert_eq!(rotation.next(), 1);
        // The second refuses as well: the same pass goes on to the third.
        rotation.leave(1);
        assert_eq!(rotation.next(), 2);
        // Lost there too, the ring wraps to the first again.
        rotation.leave(2);
        assert_eq!(rotation.next(), 0);
    }

    #[test]
    fn a_pass_that_fails_everywhere_comes_back_to_where_it_began() {
        let mut rotation = Rotation::new(3);
        rotation.leave(0);
        let pass = rotation.pass();
        for index in &pass {
            rotation.leave(*index);
        }
        assert_eq!(rotation.pass(), pass);
    }

    #[test]
    fn one_address_is_always_the_one_tried() {
        let mut rotation = Rotation::new(1);
        rotation.leave(0);
        assert_eq!(rotation.pass(), [0]);
        assert_eq!(rotation.next(), 0);
    }

    #[test]
    fn no_addresses_make_an_empty_pass() {
        let mut rotation = Rotation::new(0);
        rotation.leave(0);
        assert!(rotation.pass().is_empty());
    }
}
