//! `[broker.connection]`: how to reach RabbitMQ, and the AMQP URI that says it to lapin.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use lapin::uri::{AMQPAuthority, AMQPQueryString, AMQPScheme, AMQPUri, AMQPUserInfo};
use serde::{Deserialize, Serialize};

use super::error::ConnectError;
use crate::address::BrokerAddress;

/// How to reach RabbitMQ: `[broker.connection]`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConnectionSettings {
    /// The nodes to connect to, tried in turn (see [`Rotation`](crate::Rotation)): one for a
    /// single broker, any number of a cluster's nodes.
    pub addresses: Vec<BrokerAddress>,
    pub vhost: String,
    pub username: String,
    /// Never printed: `Debug` redacts it and it is not serialized back.
    #[serde(skip_serializing)]
    pub password: String,
    /// `amqps` instead of `amqp`. The server's certificate is always verified, against the
    /// system's CA certificates and those in `ca_file`, and must name the host of the address
    /// it is reached at.
    pub tls: bool,
    /// CA certificates (PEM) trusted for `amqps` besides the system's: a private CA.
    pub ca_file: Option<PathBuf>,
    /// Heartbeat interval; a silent broker is noticed within two of them. Zero disables them.
    #[serde(with = "humantime_serde")]
    pub heartbeat: Duration,
    /// The largest frame asked of the broker, in bytes (at least 4096): lapin keeps 32 frames
    /// of receive and of send buffer per connection, zeroed, so this sets the connection's
    /// memory (16 KiB: 1 MiB; the broker's default of 128 KiB: 8 MiB). A larger message goes
    /// in several frames.
    pub frame_max: u32,
    /// Bound on TCP connect, AMQP handshake and topology declaration.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// The name the management UI shows for the connection.
    pub connection_name: String,
    /// First wait between reconnection attempts; doubles each time.
    #[serde(with = "humantime_serde")]
    pub reconnect_min: Duration,
    /// Cap on the wait between reconnection attempts.
    #[serde(with = "humantime_serde")]
    pub reconnect_max: Duration,
    /// On shutdown, how long the connection stays up for consumers to settle their last
    /// deliveries (should exceed the consumers' shutdown grace).
    #[serde(with = "humantime_serde")]
    pub close_wait: Duration,
}

/// The frame size the host asks for unless told otherwise: 1 MiB of lapin buffers per
/// connection instead of the 8 MiB the broker's 128 KiB default costs.
pub const DEFAULT_FRAME_MAX: u32 = 16 * 1024;

/// The smallest frame AMQP 0-9-1 allows.
pub const FRAME_MAX_MIN: u32 = 4096;

impl Default for ConnectionSettings {
    fn default() -> Self {
        Self {
            addresses: vec![BrokerAddress::new("127.0.0.1", 5672)],
            vhost: "/".into(),
            username: "guest".into(),
            password: "guest".into(),
            tls: false,
            ca_file: None,
            heartbeat: Duration::from_secs(10),
            frame_max: DEFAULT_FRAME_MAX,
            connect_timeout: Duration::from_secs(10),
            connection_name: "worker-host".into(),
            reconnect_min: Duration::from_millis(500),
            reconnect_max: Duration::from_secs(30),
            close_wait: Duration::from_secs(60),
        }
    }
}

impl fmt::Debug for ConnectionSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionSettings")
            .field("addresses", &self.addresses)
            .field("vhost", &self.vhost)
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("heartbeat", &self.heartbeat)
            .field("frame_max", &self.frame_max)
            .field("connect_timeout", &self.connect_timeout)
            .field("connection_name", &self.connection_name)
            .field("reconnect_min", &self.reconnect_min)
            .field("reconnect_max", &self.reconnect_max)
            .field("close_wait", &self.close_wait)
            .finish()
    }
}

impl ConnectionSettings {
    /// Settings from an `amqp://user:password@host:port/vhost` URI (the vhost percent-encoded),
    /// with the other fields at their defaults.
    pub fn from_uri(uri: &str) -> Result<Self, ConnectError> {
        let parsed: AMQPUri = uri.parse().map_err(ConnectError::InvalidUri)?;
        Ok(Self {
            addresses: vec![BrokerAddress::new(
                parsed.authority.host,
                parsed.authority.port,
            )],
            vhost: parsed.vhost,
            username: parsed.authority.userinfo.username,
            password: parsed.authority.userinfo.password,
            tls: parsed.scheme == AMQPScheme::AMQPS,
            ..Self::default()
        })
    }

    /// `host:port/vhost` (the addresses separated by commas), for logs and errors: no
    /// credentials.
    pub fn server(&self) -> String {
        let addresses: Vec<String> = self.addresses.iter().map(ToString::to_string).collect();
        format!("{}/{}", addresses.join(","), self.vhost)
    }

    /// `host:port/vhost` of one address, for logs and errors: no credentials.
    pub fn server_at(&self, address: &BrokerAddress) -> String {
        format!("{address}/{}", self.vhost)
    }

    pub(super) fn uri(&self, address: &BrokerAddress) -> AMQPUri {
        AMQPUri {
            scheme: if self.tls {
                AMQPScheme::AMQPS
            } else {
                AMQPScheme::AMQP
            },
            authority: AMQPAuthority {
                userinfo: AMQPUserInfo {
                    username: self.username.clone(),
                    password: self.password.clone(),
                },
                host: address.host.clone(),
                port: address.port,
            },
            vhost: self.vhost.clone(),
            query: AMQPQueryString {
                frame_max: Some(self.frame_max.max(FRAME_MAX_MIN)),
                heartbeat: Some(u16::try_from(self.heartbeat.as_secs()).unwrap_or(u16::MAX)),
                connection_timeout: Some(
                    u64::try_from(self.connect_timeout.as_millis()).unwrap_or(u64::MAX),
                ),
                ..AMQPQueryString::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn debug_redacts_the_password() {
        let settings = ConnectionSettings {
            password: "hunter2".into(),
            ..ConnectionSettings::default()
        };
        let shown = format!("{settings:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("<redacted>"));
        let toml = toml::to_string(&settings).unwrap();
        assert!(!toml.contains("hunter2"), "{toml}");
    }

    #[test]
    fn settings_from_a_uri() {
        let s = ConnectionSettings::from_uri("amqp://u:p@10.0.0.1:5673/wh_test").unwrap();
        assert_eq!(s.addresses, [BrokerAddress::new("10.0.0.1", 5673)]);
        assert_eq!(
            (s.vhost.as_str(), s.username.as_str(), s.password.as_str()),
            ("wh_test", "u", "p")
        );
        assert_eq!(s.server(), "10.0.0.1:5673/wh_test");
        let uri = s.uri(&s.addresses[0]);
        assert_eq!(uri.query.heartbeat, Some(10));
        assert_eq!(uri.query.frame_max, Some(DEFAULT_FRAME_MAX));
    }

    #[test]
    fn several_addresses_show_as_one_server_and_each_as_its_own() {
        let s = ConnectionSettings {
            addresses: vec![
                BrokerAddress::new("mq-1", 5672),
                BrokerAddress::new("mq-2", 5673),
            ],
            vhost: "wh".into(),
            ..ConnectionSettings::default()
        };
        assert_eq!(s.server(), "mq-1:5672,mq-2:5673/wh");
        assert_eq!(s.server_at(&s.addresses[1]), "mq-2:5673/wh");
        let uri = s.uri(&s.addresses[1]);
        assert_eq!(
            (uri.authority.host.as_str(), uri.authority.port),
            ("mq-2", 5673)
        );
    }
}
