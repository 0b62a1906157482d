//! Opening one connection, without supervision: the [`Supervisor`](super::Supervisor) does
//! it on every reconnect, tools, tests and benchmarks call it directly.

use lapin::types::LongString;
use lapin::{Connection, ConnectionProperties};

use super::error::ConnectError;
use super::settings::ConnectionSettings;
use crate::address::BrokerAddress;

impl ConnectionSettings {
    /// The PEM text of `ca_file`, read at each connect so that a renewed CA is picked up.
    fn ca_chain(&self) -> Result<Option<String>, ConnectError> {
        let Some(path) = &self.ca_file else {
            return Ok(None);
        };
        std::fs::read_to_string(path)
            .map(Some)
            .map_err(|source| ConnectError::CaFile {
                path: path.clone(),
                source,
            })
    }

    /// Opens one connection, without supervision (tools, tests, benchmarks): to the first of
    /// the addresses that answers, trying each once in order.
    pub async fn connect(&self) -> Result<Connection, ConnectError> {
        let mut failures = Vec::new();
        for address in &self.addresses {
            match self.connect_to(address).await {
                Ok(connection) => return Ok(connection),
                Err(err) => failures.push(err),
            }
        }
        Err(ConnectError::of_pass(failures))
    }

    /// Opens one connection to `address` (one of [`Self::addresses`], or any other node of the
    /// same broker), without supervision.
    pub async fn connect_to(&self, address: &BrokerAddress) -> Result<Connection, ConnectError> {
        let server = self.server_at(address);
        let properties = ConnectionProperties::default()
            .with_connection_name(LongString::from(self.connection_name.as_str()));
        let tls = lapin::tcp::OwnedTLSConfig {
            identity: None,
            cert_chain: self.ca_chain()?,
        };
        let runtime = lapin::runtime::default_runtime().map_err(|source| ConnectError::Broker {
            server: server.clone(),
            source,
        })?;
        match tokio::time::timeout(
            self.connect_timeout,
            Connection::connect_uri_with_config(self.uri(address), properties, tls, runtime),
        )
        .await
        {
            Err(_) => Err(ConnectError::Timeout {
                server,
                after: self.connect_timeout,
            }),
            Ok(Err(source)) => Err(ConnectError::Broker { server, source }),
            Ok(Ok(connection)) => Ok(connection),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    #[tokio::test]
    async fn a_connect_that_no_address_answers_names_every_address() {
        // A port nothing listens on refuses at once: connect tries the second address after
        // the first, and both failures come back, each naming its address.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let s = ConnectionSettings {
            addresses: vec![
                BrokerAddress::new("127.0.0.1", closed),
                BrokerAddress::new("localhost", closed),
            ],
            connect_timeout: Duration::from_secs(2),
            ..ConnectionSettings::default()
        };
        let err = worker_core::error_chain(&s.connect().await.unwrap_err());
        assert!(err.contains(&format!("127.0.0.1:{closed}")), "{err}");
        assert!(err.contains(&format!("localhost:{closed}")), "{err}");
    }
}
