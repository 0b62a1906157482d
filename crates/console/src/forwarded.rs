//! Who a request comes from. The peer of the connection, unless the peer is one of
//! `admin.trusted_proxies`: then its `X-Forwarded-For` names the client and its
//! `X-Forwarded-Proto` says whether the browser used HTTPS. The same headers from any other
//! peer are ignored, so that nobody can pose as another address or make a cookie lose its
//! `Secure` flag.

use std::net::{IpAddr, SocketAddr};

use axum::http::HeaderMap;
use ipnet::IpNet;

/// The headers a proxy adds. A request that carries any of them came through one, which
/// reading without a session is never allowed for.
const FORWARDED_HEADERS: [&str; 5] = [
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-real-ip",
];

/// The proxies whose forwarded headers count.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<IpNet>);

/// Where one request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    /// The client's address: the peer's, or the one a trusted proxy forwarded.
    pub ip: IpAddr,
    /// The connection came from a trusted proxy.
    pub proxied: bool,
    /// The browser reached the proxy over HTTPS (a trusted proxy said so).
    pub tls: bool,
    /// The request carries forwarded headers, trusted or not.
    pub forwarded: bool,
}

impl Client {
    /// How the audit trail and the log name it: the address, and the proxy it came through.
    pub fn label(&self, peer: IpAddr) -> String {
        if self.proxied && self.ip != peer {
            format!("{} via {peer}", self.ip)
        } else {
            self.ip.to_string()
        }
    }
}

/// `::ffff:127.0.0.1` as `127.0.0.1`, so that a list of IPv4 proxies matches a dual-stack
/// listener's peers.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

impl TrustedProxies {
    pub fn new(networks: Vec<IpNet>) -> Self {
        Self(networks)
    }

    pub fn trusts(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// Where the request with `headers` on a connection from `peer` comes from.
    pub fn client(&self, peer: SocketAddr, headers: &HeaderMap) -> Client {
        let peer_ip = canonical(peer.ip());
        let forwarded = FORWARDED_HEADERS.iter().any(|h| headers.contains_key(*h));
        if !self.trusts(peer_ip) {
            return Client {
                ip: peer_ip,
                proxied: false,
                tls: false,
                forwarded,
            };
        }
        Client {
            ip: self.forwarded_for(peer_ip, headers),
            proxied: true,
            tls: last_value(headers, "x-forwarded-proto")
                .is_some_and(|proto| proto.eq_ignore_ascii_case("https")),
            forwarded,
        }
    }

    /// The nearest hop of `X-Forwarded-For` that is not a trusted proxy (each proxy appends
    /// the address it saw, so hops left of the first untrusted one may be made up); the last
    /// trusted hop where every hop is trusted or one cannot be read.
    fn forwarded_for(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let hops: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        let mut client = peer;
        for hop in hops.iter().rev() {
            let Ok(ip) = hop.parse::<IpAddr>() else {
                break;
            };
            client = canonical(ip);
            if !self.trusts(client) {
                break;
            }
        }
        client
    }
}

/// The last value of a header a proxy may have appended to (`https, http` → `http`).
fn last_value<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .rfind(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxies(list: &[&str]) -> TrustedProxies {
        TrustedProxies::new(
            list.iter()
                .map(|t| crate::settings::parse_network(t).unwrap())
                .collect(),
        )
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, value.parse().unwrap());
        }
        map
    }

    fn peer(ip: &str) -> SocketAddr {
        SocketAddr::new(ip.parse().unwrap(), 50000)
    }

    #[test]
    fn forwarded_headers_from_an_untrusted_peer_are_ignored() {
        let client = proxies(&["10.0.0.1"]).client(
            peer("192.0.2.7"),
            &headers(&[
                ("x-forwarded-for", "203.0.113.9"),
                ("x-forwarded-proto", "https"),
            ]),
        );
        assert_eq!(client.ip, "192.0.2.7".parse::<IpAddr>().unwrap());
        assert!(!client.tls && !client.proxied && client.forwarded);
    }

    #[test]
    fn a_trusted_proxy_names_the_client_and_says_https() {
        let client = proxies(&["10.0.0.0/8"]).client(
            peer("10.0.0.1"),
            &headers(&[
                ("x-forwarded-for", "203.0.113.9"),
                ("x-forwarded-proto", "https"),
            ]),
        );
        assert_eq!(client.ip, "203.0.113.9".parse::<IpAddr>().unwrap());
        assert!(client.tls && client.proxied);
        assert_eq!(
            client.label(peer("10.0.0.1").ip()),
            "203.0.113.9 via 10.0.0.1"
        );
    }

    #[test]
    fn a_hop_the_client_made_up_left_of_the_proxys_own_is_not_taken() {
        let client = proxies(&["10.0.0.1"]).client(
            peer("10.0.0.1"),
            &headers(&[("x-forwarded-for", "198.51.100.1, 203.0.113.9")]),
        );
        assert_eq!(client.ip, "203.0.113.9".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn chained_trusted_proxies_are_walked_past() {
        let client = proxies(&["10.0.0.0/8"]).client(
            peer("10.0.0.1"),
            &headers(&[("x-forwarded-for", "203.0.113.9, 10.0.0.2")]),
        );
        assert_eq!(client.ip, "203.0.113.9".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn an_unreadable_hop_stops_at_the_last_trusted_one() {
        let client = proxies(&["10.0.0.1"]).client(
            peer("10.0.0.1"),
            &headers(&[("x-forwarded-for", "not-an-address")]),
        );
        assert_eq!(client.ip, "10.0.0.1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn an_ipv4_mapped_peer_matches_an_ipv4_proxy() {
        assert!(proxies(&["127.0.0.1"]).trusts("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!proxies(&[]).trusts("127.0.0.1".parse().unwrap()));
    }

    #[test]
    fn the_last_proto_a_proxy_appended_counts() {
        let client = proxies(&["10.0.0.1"]).client(
            peer("10.0.0.1"),
            &headers(&[("x-forwarded-proto", "https, http")]),
        );
        assert!(!client.tls);
    }
}
