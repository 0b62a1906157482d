//! `worker-host health`: whether the running host is ready, asked of its own `/readyz`. For a
//! container's `HEALTHCHECK`, which has no curl: exit 0 when ready, 1 when not or when nothing
//! answers, as health checks expect.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use crate::exit::{self, Fatal};
use crate::settings::Settings;

/// How long the host may take to answer; a container's health check gives about this much.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// The admin endpoint's base URL as a client on this machine reaches it: an address that
/// listens on every interface is asked on loopback.
pub fn admin_base(listen: SocketAddr) -> String {
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, listen.port()))
}

pub async fn run(settings: &Settings) -> Result<(), Fatal> {
    if !settings.admin.enabled {
        return Err(Fatal::usage(
            "admin.enabled = false: the host serves no /readyz to ask",
        ));
    }
    let url = format!("{}/readyz", admin_base(settings.admin.listen));
    let unhealthy = |message: String| Fatal {
        code: exit::UNHEALTHY,
        message,
    };
    let client = reqwest::Client::builder()
        .timeout(ANSWER_WITHIN)
        .build()
        .map_err(|e| Fatal::software(format!("the HTTP client cannot start: {e}")))?;
    let response = client
        .get(&url)
        .send()
        .await
        .map_err(|e| unhealthy(format!("not healthy: no host answers at {url}: {e}")))?;
    let status = response.status();
    let body: serde_json::Value = response.json().await.unwrap_or_default();
    if status.is_success() {
        println!("ready");
        return Ok(());
    }
    let down: Vec<String> = body["checks"]
        .as_object()
        .map(|checks| {
            checks
                .iter()
                .filter(|(_, check)| check["status"] != "up")
                .map(|(name, check)| {
                    format!("{name}: {}", check["error"].as_str().unwrap_or("down"))
                })
                .collect()
        })
        .unwrap_or_default();
    Err(unhealthy(if down.is_empty() {
        format!("not ready: {url} answered {status}")
    } else {
        format!("not ready: {}", down.join("; "))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_interface_is_asked_on_loopback_and_a_given_address_as_given() {
        let at = |s: &str| admin_base(s.parse().unwrap());
        assert_eq!(at("0.0.0.0:9180"), "http://127.0.0.1:9180");
        assert_eq!(at("[::]:9180"), "http://[::1]:9180");
        assert_eq!(at("10.0.0.5:9180"), "http://10.0.0.5:9180");
    }
}
