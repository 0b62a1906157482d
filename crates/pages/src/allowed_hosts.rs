//! The `Host` check of the admin port and of the fleet view, against DNS rebinding: a page on
//! another site whose name is made to resolve to 127.0.0.1 can have an operator's browser
//! (with an SSH tunnel open, say) send requests to the console, and read the answers as its
//! own, since to the browser they come from the page's own name. Such a request carries that
//! name in `Host`; so every request whose `Host` is not a name this server is reached by is
//! answered `421 Misdirected Request`, before any other check or handler runs.
//!
//! The names always answered to: any address (`10.0.0.5:9180`, `[::1]`: a rebinding page's
//! browser sends the page's name, never an address), the loopback name `localhost` and the
//! listen address, on any port (an SSH tunnel forwards another port); besides them, the
//! names the settings list (`admin.allowed_hosts`, the fleet view's `allowed_hosts`): the
//! public name a reverse proxy passes on, a name an operator's browser uses. A listed name
//! with a port (`console.example.net:8443`) counts on that port only. `/healthz` and
//! `/readyz` are checked too: the container's health check asks on loopback
//! (`worker-host health`), and a probe that connects by another address can send
//! `Host: localhost`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The loopback names every server here answers to, on any port.
const LOOPBACK: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// The longest `Host` quoted back in a refusal.
const QUOTED_MAX_CHARS: usize = 100;

/// One name a server answers to: a host (lower-case, IPv6 in brackets) and, if given, the one
/// port it counts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHost {
    host: String,
    port: Option<u16>,
}

impl AllowedHost {
    /// `console.example.net`, `console.example.net:8443`, `10.0.0.5`, `[fd00::5]:9180`: a host
    /// name or address, and a port if it counts on that one only. Not a URL, and no path.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err(
                "expected a host name (`console.example.net`), found an empty string".into(),
            );
        }
        if text.contains("://") || text.contains(['/', '@', '?', '#']) {
            return Err(format!(
                "expected a host name with an optional port (`console.example.net` or `console.example.net:8443`), not a URL, found `{text}`"
            ));
        }
        let (host, port) = split(text).ok_or_else(|| {
            format!("expected a host name with an optional port (1 to 65535), found `{text}`")
        })?;
        let valid = if let Some(inner) = host.strip_prefix('[') {
            inner
                .strip_suffix(']')
                .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok())
        } else {
            host.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            })
        };
        if !valid || port == Some(0) {
            return Err(format!(
                "expected a host name, an IPv4 address or an IPv6 address in brackets, with an optional port (1 to 65535), found `{text}`"
            ));
        }
        Ok(Self { host, port })
    }

    fn matches(&self, host: &str, port: Option<u16>) -> bool {
        self.host == host && self.port.is_none_or(|p| Some(p) == port)
    }
}

/// A `Host` value split into its host (lower-case, without a trailing dot, IPv6 kept in
/// brackets) and port; `None` when it is not of that shape.
fn split(value: &str) -> Option<(String, Option<u16>)> {
    let value = value.trim().to_ascii_lowercase();
    let (host, port) = if value.starts_with('[') {
        let end = value.find(']')?;
        let (host, rest) = value.split_at(end + 1);
        match rest {
            "" => (host.to_string(), None),
            _ => (
                host.to_string(),
                Some(rest.strip_prefix(':')?.parse().ok()?),
            ),
        }
    } else {
        match value.rsplit_once(':') {
            Some((host, port)) => (host.to_string(), Some(port.parse().ok()?)),
            None => (value, None),
        }
    };
    let host = host.strip_suffix('.').map(str::to_string).unwrap_or(host);
    (!host.is_empty()).then_some((host, port))
}

/// `10.0.0.5` or `[fd00::5]`, as [`split`] leaves a host.
fn is_address(host: &str) -> bool {
    match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(inner) => inner.parse::<std::net::Ipv6Addr>().is_ok(),
        None => host.parse::<std::net::Ipv4Addr>().is_ok(),
    }
}

/// The names one server answers to.
#[derive(Debug, Clone)]
pub struct AllowedHosts {
    names: Arc<Vec<AllowedHost>>,
    /// The setting that lists more, named in a refusal (`admin.allowed_hosts`).
    setting: &'static str,
}

impl AllowedHosts {
    /// The loopback names and `listen`'s address (unless it is every address), each on any
    /// port, and `listed` (each checked by `config check`; one that does not parse is
    /// skipped here).
    pub fn new(listen: SocketAddr, listed: &[String], setting: &'static str) -> Self {
        let mut names: Vec<AllowedHost> = LOOPBACK
            .iter()
            .filter_map(|name| AllowedHost::parse(name).ok())
            .collect();
        if !listen.ip().is_unspecified() {
            let host = match listen.ip() {
                IpAddr::V4(ip) => ip.to_string(),
                IpAddr::V6(ip) => format!("[{ip}]"),
            };
            names.push(AllowedHost { host, port: None });
        }
        names.extend(listed.iter().filter_map(|l| AllowedHost::parse(l).ok()));
        Self {
            names: Arc::new(names),
            setting,
        }
    }

    /// Whether a request with this `Host` value is one for this server: a listed name, or an
    /// address. An address is never what a rebinding page sends (its browser sends the page's
    /// own name), and a scraper or probe that connects by address (Prometheus on `10.0.0.5:9180`
    /// while `listen` is `0.0.0.0`) must keep working without a list of every address.
    pub fn allows(&self, host: &str) -> bool {
        split(host).is_some_and(|(host, port)| {
            is_address(&host) || self.names.iter().any(|n| n.matches(&host, port))
        })
    }

    /// `None` when `request` names this server (its `Host`, and the authority of an
    /// absolute-form target, if any); else the refusal: `421` with a plain body naming the
    /// `Host` and the setting.
    pub fn refusal(&self, request: &Request) -> Option<Response> {
        let host = request
            .headers()
            .get(header::HOST)
            .map(|value| value.to_str().unwrap_or("(not text)"));
        let authority = request.uri().authority().map(|a| a.as_str());
        let named = [host, authority].into_iter().flatten();
        let wrong = match host {
            None => Some("(none)"),
            Some(_) => named.clone().find(|name| !self.allows(name)),
        }?;
        let quoted: String = worker_core::text::visible(wrong)
            .chars()
            .take(QUOTED_MAX_CHARS)
            .collect();
        let body = format!(
            "421 Misdirected Request: this server does not answer to the host name `{quoted}`. It answers to any IP address, to localhost and to the names in {setting}; a page whose name resolves here is refused (DNS rebinding). Behind a reverse proxy, list the name it passes on in {setting}.\n",
            setting = self.setting
        );
        tracing::debug!(host = %quoted, "a request for another host name was refused");
        Some(
            (
                StatusCode::MISDIRECTED_REQUEST,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                body,
            )
                .into_response(),
        )
    }
}

/// The middleware: refuses a request for another host name before anything else sees it.
pub async fn guard(State(allowed): State<AllowedHosts>, request: Request, next: Next) -> Response {
    match allowed.refusal(&request) {
        Some(refused) => refused,
        None => next.run(request).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(listen: &str, listed: &[&str]) -> AllowedHosts {
        let listed: Vec<String> = listed.iter().map(|s| (*s).to_string()).collect();
        AllowedHosts::new(listen.parse().unwrap(), &listed, "admin.allowed_hosts")
    }

    #[test]
    fn loopback_names_and_the_listen_address_are_answered_on_any_port() {
        let hosts = allowed("10.0.0.5:9180", &[]);
        for host in [
            "localhost",
            "LOCALHOST:9999",
            "127.0.0.1:9180",
            "[::1]:9180",
            "[::1]",
            "10.0.0.5:9180",
            "10.0.0.5",
            "localhost.",
        ] {
            assert!(hosts.allows(host), "{host}");
        }
    }

    #[test]
    fn another_name_is_refused_even_when_it_resolves_to_loopback() {
        let hosts = allowed("127.0.0.1:9180", &[]);
        for host in [
            "evil.example",
            "evil.example:9180",
            "127.0.0.1.evil.example",
            "localhost.evil.example",
            "",
            "127.0.0.1:notaport",
            "[::1",
        ] {
            assert!(!hosts.allows(host), "{host}");
        }
    }

    #[test]
    fn an_address_is_answered_since_no_rebinding_page_sends_one() {
        let every = allowed("0.0.0.0:9180", &[]);
        for host in ["10.0.0.5:9180", "192.168.1.20", "[fd00::5]:9180"] {
            assert!(every.allows(host), "{host}");
        }
        assert!(
            !every.allows("wh-1:9180"),
            "a name is answered only when listed"
        );
        assert!(!every.allows("10.0.0.5.nip.io:9180"));
    }

    #[test]
    fn a_listed_name_counts_on_any_port_or_on_its_own() {
        let hosts = allowed(
            "127.0.0.1:9180",
            &["Console.Example.net", "other.example.net:8443"],
        );
        assert!(hosts.allows("console.example.net"));
        assert!(hosts.allows("console.example.net:443"));
        assert!(hosts.allows("other.example.net:8443"));
        assert!(!hosts.allows("other.example.net"));
        assert!(!hosts.allows("other.example.net:443"));
    }

    #[test]
    fn an_entry_that_is_a_url_or_no_name_is_refused_naming_it() {
        for bad in [
            "https://console.example.net",
            "console.example.net/",
            "user@console.example.net",
            "",
            "console example",
            "console.example.net:0",
            "console.example.net:70000",
            "[not-an-ip]",
        ] {
            let error = AllowedHost::parse(bad).unwrap_err();
            assert!(error.contains(bad.trim()), "{bad}: {error}");
        }
        assert!(AllowedHost::parse("[fd00::5]:9180").is_ok());
        assert!(AllowedHost::parse("10.0.0.5").is_ok());
    }

    #[tokio::test]
    async fn a_refusal_is_421_in_plain_words_naming_the_host_and_the_setting() {
        let hosts = allowed("127.0.0.1:9180", &[]);
        let request = Request::builder()
            .uri("/api/overview")
            .header(header::HOST, "evil.example:9180")
            .body(axum::body::Body::empty())
            .unwrap();
        let refused = hosts.refusal(&request).unwrap();
        assert_eq!(refused.status(), StatusCode::MISDIRECTED_REQUEST);
        let body = axum::body::to_bytes(refused.into_body(), 4096)
            .await
            .unwrap();
        let body = String::from_utf8_lossy(&body);
        assert!(
            body.contains("`evil.example:9180`") && body.contains("admin.allowed_hosts"),
            "{body}"
        );
        let absolute = Request::builder()
            .uri("http://evil.example/api/overview")
            .header(header::HOST, "127.0.0.1:9180")
            .body(axum::body::Body::empty())
            .unwrap();
        assert!(
            hosts.refusal(&absolute).is_some(),
            "the target's authority counts"
        );
        let none = Request::builder()
            .uri("/healthz")
            .body(axum::body::Body::empty())
            .unwrap();
        assert!(hosts.refusal(&none).is_some(), "no Host is no name of ours");
    }
}
