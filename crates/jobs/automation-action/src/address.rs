//! Which addresses a webhook may reach: not the inside of the installation, unless it says so.
//!
//! An automation names its webhook's URL, and an automation can be written by anyone who can
//! import one; without a check a webhook reaches the admin port, the broker's management API
//! or a cloud's metadata service, and the start of the answer comes back in the dead letter.
//! So by default a webhook may not reach an address that is [`inside`]: loopback, private,
//! shared (carrier-grade NAT), link-local, IETF protocol assignments (192.0.0.0/24),
//! benchmarking (198.18.0.0/15), unique-local, site-local, multicast, broadcast or reserved,
//! or unspecified, for IPv4 and IPv6, with IPv4 carried in IPv6 (mapped, compatible, NAT64,
//! 6to4) judged as the IPv4 address it carries; local-use NAT64 (64:ff9b:1::/48) and Teredo
//! (2001::/32), which carry it in ways of their own, are refused whole.
//!
//! The check is made on the address that is connected to, not on the URL's text: a host
//! written as an address is checked as it is (after the URL parser has read it, so that
//! `2130706433` is 127.0.0.1), and a name is checked in the HTTP client's own resolver
//! ([`GuardedResolver`]), so that what is checked is what the client then connects to (no
//! second lookup an attacker's DNS could answer differently). A name that resolves to any
//! inside address is refused as a whole. The client follows no redirect and uses no proxy.
//!
//! [`WebhookAllow`] (the host's `jobs.automation_action.webhook_allow`) names what an
//! installation lets through: a host name (`hooks.internal`), a host name and port
//! (`hooks.internal:8443`), an address (`10.1.2.3`, `[fd00::1]:8080`) or a CIDR range
//! (`10.20.0.0/16`).
//!
//! ```
//! use job_automation_action::address::{WebhookAllow, inside};
//!
//! assert_eq!(inside("169.254.169.254".parse()?), Some("link-local"));
//! assert_eq!(inside("::ffff:127.0.0.1".parse()?), Some("loopback"));
//! assert_eq!(inside("93.184.215.14".parse()?), None);
//!
//! let allow = WebhookAllow::parse(["hooks.internal:8443", "10.20.0.0/16"])?;
//! assert!(allow.permits_address("10.20.3.4".parse()?, 80));
//! assert!(!allow.permits_address("10.21.0.1".parse()?, 80));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Why `ip` is inside (`loopback`, `private`, …), or `None` for an address a webhook may
/// reach by default. IPv4 carried in IPv6 is judged as that IPv4 address.
pub fn inside(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => inside_v4(v4),
        IpAddr::V6(v6) => match carried_v4(v6) {
            Some(v4) => inside_v4(v4),
            None => inside_v6(v6),
        },
    }
}

fn inside_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        // 0.0.0.0/8: "this network"; 0.0.0.0 itself connects to the local host on Linux.
        (0, ..) => "unspecified",
        (127, ..) => "loopback",
        (10, ..) | (172, 16..=31, _) | (192, 168, _) => "private",
        (100, 64..=127, _) => "shared (carrier-grade NAT)",
        (169, 254, _) => "link-local",
        // 192.0.0.0/24 (RFC 6890): DS-Lite's and NAT64's own addresses, PCP anycast, …: the
        // machinery of the network the host sits in, never a receiver outside it.
        (192, 0, 0) => "IETF protocol assignments",
        // 198.18.0.0/15 (RFC 2544): test networks, often routed to lab equipment inside.
        (198, 18..=19, _) => "benchmarking",
        (224..=239, ..) => "multicast",
        (240..=255, ..) => "reserved or broadcast",
        _ => return None,
    })
}

fn inside_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let [first, second, third, ..] = ip.segments();
    Some(if ip.is_unspecified() {
        "unspecified"
    } else if ip.is_loopback() {
        "loopback"
    } else if (first, second, third) == (0x64, 0xff9b, 1) {
        // 64:ff9b:1::/48 (RFC 8215): a translator of the installation's own, whose IPv4
        // side may be anything inside; where it puts the IPv4 address is its own choice, so
        // the range is refused whole rather than read as the address it carries.
        "local-use NAT64"
    } else if (first, second) == (0x2001, 0) {
        // 2001::/32 (RFC 4380): Teredo tunnels IPv6 over UDP through a relay to an IPv4
        // host whose address it carries obfuscated; refused whole, as NAT64's local use.
        "Teredo"
    } else if first & 0xffc0 == 0xfe80 {
        "link-local"
    } else if first & 0xffc0 == 0xfec0 {
        "site-local"
    } else if first & 0xfe00 == 0xfc00 {
        "unique-local"
    } else if first & 0xff00 == 0xff00 {
        "multicast"
    } else {
        return None;
    })
}

/// The IPv4 address an IPv6 address carries to an IPv4 host: mapped (`::ffff:a.b.c.d`),
/// compatible (`::a.b.c.d`, deprecated but still routed by some stacks), NAT64
/// (`64:ff9b::a.b.c.d`) and 6to4 (`2002:aabb:ccdd::`).
fn carried_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = ip.segments();
    let low = || Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        // `::` and `::1` are IPv6's own unspecified and loopback addresses.
        [0, 0, 0, 0, 0, 0, 0, 0 | 1] => None,
        [0, 0, 0, 0, 0, 0, _, _] => Some(low()),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(low()),
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::new(
            (hi >> 8) as u8,
            hi as u8,
            (lo >> 8) as u8,
            lo as u8,
        )),
        _ => None,
    }
}

/// One entry of `webhook_allow` that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{entry}`: {problem}")]
pub struct AllowError {
    /// Its position in the list.
    pub index: usize,
    pub entry: String,
    pub problem: String,
}

/// What an installation lets its webhooks reach inside (see the module docs). Empty by
/// default: nothing inside.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WebhookAllow {
    /// Host names, lower case, each with the one port it is allowed on (`None`: any).
    names: Vec<(String, Option<u16>)>,
    /// Addresses and ranges, each with its port (`None`: any).
    nets: Vec<(IpNet, Option<u16>)>,
}

impl WebhookAllow {
    /// Reads the entries: `name`, `name:port`, `address`, `address:port` (IPv6 in brackets)
    /// or `address/prefix`.
    pub fn parse<I, S>(entries: I) -> Result<Self, AllowError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut allow = Self::default();
        for (index, entry) in entries.into_iter().enumerate() {
            let entry = entry.as_ref();
            let fail = |problem: &str| AllowError {
                index,
                entry: entry.to_string(),
                problem: problem.to_string(),
            };
            let text = entry.trim();
            if text.is_empty() {
                return Err(fail(
                    "expected a host, host:port or CIDR range, found nothing",
                ));
            }
            if text.contains("://") {
                return Err(fail("expected a host, host:port or CIDR range, not a URL"));
            }
            if text.contains('/') {
                let net: IpNet = text
                    .parse()
                    .map_err(|_| fail("expected a CIDR range such as 10.0.0.0/8 or fd00::/8"))?;
                allow.nets.push((net.trunc(), None));
                continue;
            }
            if let Ok(ip) = text.parse::<IpAddr>() {
                allow.nets.push((IpNet::from(canonical(ip)), None));
                continue;
            }
            if let Ok(addr) = text.parse::<SocketAddr>() {
                allow
                    .nets
                    .push((IpNet::from(canonical(addr.ip())), Some(addr.port())));
                continue;
            }
            let (host, port) = match text.rsplit_once(':') {
                Some((host, port)) => {
                    let port: u16 = port
                        .parse()
                        .ok()
                        .filter(|p| *p != 0)
                        .ok_or_else(|| fail("expected a port from 1 to 65535 after the `:`"))?;
                    (host, Some(port))
                }
                None => (text, None),
            };
            if host.is_empty()
                || host.starts_with('[')
                || !host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
            {
                return Err(fail(
                    "expected a host name, an address or a CIDR range (IPv6 with a port in brackets)",
                ));
            }
            allow.names.push((normalize_name(host), port));
        }
        Ok(allow)
    }

    /// Whether nothing is allowed inside.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty() && self.nets.is_empty()
    }

    /// Whether a webhook may connect to `ip` on `port`: an address outside, or one the list
    /// names for that port.
    pub fn permits_address(&self, ip: IpAddr, port: u16) -> bool {
        let ip = canonical(ip);
        inside(ip).is_none()
            || self
                .nets
                .iter()
                .any(|(net, p)| net.contains(&ip) && p.is_none_or(|p| p == port))
    }

    /// Whether the list names host `name` for `port`: its addresses are then not checked.
    pub fn permits_name(&self, name: &str, port: u16) -> bool {
        let name = normalize_name(name);
        self.names
            .iter()
            .any(|(n, p)| *n == name && p.is_none_or(|p| p == port))
    }

    /// The ports the list names, each once: a webhook client is built for each, since a
    /// resolver learns the name but not the port (see [`GuardedResolver`]).
    pub fn ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .names
            .iter()
            .filter_map(|(_, p)| *p)
            .chain(self.nets.iter().filter_map(|(_, p)| *p))
            .collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    /// The entries that hold for a URL on `port` (those for any port and those for it),
    /// without their ports.
    pub fn for_port(&self, port: Option<u16>) -> Self {
        let holds = |p: &Option<u16>| p.is_none() || *p == port;
        Self {
            names: self
                .names
                .iter()
                .filter(|(_, p)| holds(p))
                .map(|(n, _)| (n.clone(), None))
                .collect(),
            nets: self
                .nets
                .iter()
                .filter(|(_, p)| holds(p))
                .map(|(n, _)| (*n, None))
                .collect(),
        }
    }
}

/// `Example.COM.` and `example.com` are one host.
fn normalize_name(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is, so that one rule covers both.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// A webhook that may not go where it asked, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub reason: String,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for Refused {}

/// Refuses `ip` unless `allow` permits it on `port`; names the host it came from.
pub fn check_address(
    allow: &WebhookAllow,
    host: &str,
    ip: IpAddr,
    port: u16,
) -> Result<(), Refused> {
    match inside(canonical(ip)) {
        Some(kind) if !allow.permits_address(ip, port) => Err(Refused {
            reason: if host == ip.to_string() {
                format!(
                    "{ip} is a {kind} address; a webhook may not reach it unless \
                     jobs.automation_action.webhook_allow names it"
                )
            } else {
                format!(
                    "{host} resolves to {ip}, a {kind} address; a webhook may not reach it \
                     unless jobs.automation_action.webhook_allow names it"
                )
            },
        }),
        _ => Ok(()),
    }
}

/// The webhook client's resolver: the system's (`getaddrinfo`), then every address checked
/// against an allow list already narrowed to one port ([`WebhookAllow::for_port`]). A name
/// the list names is not checked. The addresses it returns are the only ones the client
/// connects to, so the check cannot be raced.
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    allow: Arc<WebhookAllow>,
}

impl GuardedResolver {
    pub fn new(allow: WebhookAllow) -> Self {
        Self {
            allow: Arc::new(allow),
        }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow = Arc::clone(&self.allow);
        let host = name.as_str().to_string();
        Box::pin(async move {
            // Port 0: the client puts the URL's port on each address afterwards.
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            // The allow list is narrowed to the URL's port already: port 0 matches any.
            if !allow.permits_name(&host, 0) {
                for addr in &addrs {
                    check_address(&allow, &host, addr.ip(), 0)?;
                }
            }
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn every_inside_range_is_named() {
        for (addr, kind) in [
            ("0.0.0.0", "unspecified"),
            ("127.0.0.1", "loopback"),
            ("127.255.1.2", "loopback"),
            ("10.0.0.1", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("100.64.0.1", "shared (carrier-grade NAT)"),
            ("169.254.169.254", "link-local"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "reserved or broadcast"),
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("fe80::1", "link-local"),
            ("fec0::1", "site-local"),
            ("fc00::1", "unique-local"),
            ("fd12:3456::1", "unique-local"),
            ("ff02::1", "multicast"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.1.2.3", "private"),
            ("::127.0.0.1", "loopback"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
            ("2002:7f00:1::", "loopback"),
            ("192.0.0.1", "IETF protocol assignments"),
            ("192.0.0.255", "IETF protocol assignments"),
            ("198.18.0.1", "benchmarking"),
            ("198.19.255.255", "benchmarking"),
            ("::ffff:198.18.0.1", "benchmarking"),
            ("64:ff9b:1::a9fe:a9fe", "local-use NAT64"),
            ("64:ff9b:1:ffff::1", "local-use NAT64"),
            ("2001::1", "Teredo"),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
        ] {
            assert_eq!(inside(ip(addr)), Some(kind), "{addr}");
        }
        for addr in [
            "1.1.1.1",
            "93.184.215.14",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700:4700::1111",
            "::ffff:1.1.1.1",
            "2002:0101:0101::",
            "192.0.1.1",
            "198.17.255.255",
            "198.20.0.1",
            "64:ff9b:2::1",
            "2001:1::1",
            "2001:4860:4860::8888",
        ] {
            assert_eq!(inside(ip(addr)), None, "{addr}");
        }
    }

    #[test]
    fn allow_entries_are_names_addresses_and_ranges_with_or_without_ports() {
        let allow = WebhookAllow::parse([
            "Hooks.Internal",
            "api.internal:8443",
            "10.20.0.0/16",
            "127.0.0.1:9000",
            "[fd00::1]:8080",
            "::1",
        ])
        .unwrap();
        assert!(allow.permits_name("hooks.internal.", 1));
        assert!(allow.permits_name("api.internal", 8443));
        assert!(!allow.permits_name("api.internal", 443));
        assert!(allow.permits_address(ip("10.20.9.9"), 1));
        assert!(!allow.permits_address(ip("10.21.0.1"), 1));
        assert!(allow.permits_address(ip("127.0.0.1"), 9000));
        assert!(allow.permits_address(ip("::ffff:127.0.0.1"), 9000));
        assert!(!allow.permits_address(ip("127.0.0.1"), 9001));
        assert!(allow.permits_address(ip("fd00::1"), 8080));
        assert!(!allow.permits_address(ip("fd00::1"), 80));
        assert!(allow.permits_address(ip("::1"), 5));
        assert_eq!(allow.ports(), vec![8080, 8443, 9000]);
        let narrowed = allow.for_port(Some(9000));
        assert!(narrowed.permits_address(ip("127.0.0.1"), 0));
        assert!(!narrowed.permits_name("api.internal", 0));
    }

    #[test]
    fn an_unreadable_allow_entry_names_its_position() {
        for (entry, problem) in [
            ("", "found nothing"),
            ("10.0.0.0/33", "CIDR"),
            ("hooks.internal:http", "port"),
            ("hooks.internal:0", "port"),
            ("http://hooks.internal", "not a URL"),
            ("hooks internal", "host name"),
            ("fd00::1:zz", "port"),
        ] {
            let err = WebhookAllow::parse(["ok.internal", entry]).unwrap_err();
            assert_eq!(err.index, 1, "{entry}");
            assert!(err.problem.contains(problem), "{entry}: {err}");
        }
    }
}
