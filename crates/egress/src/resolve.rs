//! Name resolution done by the proxy itself (static entries first, then the system resolver) and the
//! address-level check: every resolved address must be public or inside an operator-allowed CIDR. The checked
//! addresses are the only ones the proxy then connects to, so a second (rebinding) lookup never happens.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;

use crate::host::{Host, unmap};
use crate::local::is_local;
use crate::ranges::special_range;

/// How a refusal names an address of the proxy's own host.
const LOCAL: &str = "an address of this host (the proxy's own)";

/// The proxy's resolver and address policy.
#[derive(Debug, Clone)]
pub(crate) struct Resolver {
    pub(crate) hosts: HashMap<String, Vec<IpAddr>>,
    pub(crate) allow_cidrs: Vec<IpNet>,
    pub(crate) timeout: Duration,
}

/// Addresses that passed the check, in the order to try them.
#[derive(Debug, Clone)]
pub(crate) struct Checked {
    pub(crate) addrs: Vec<IpAddr>,
    /// Set when a special-range address was let through by `allow_cidrs`: says which.
    pub(crate) via_cidr: Option<String>,
}

/// Why the addresses were not acceptable.
#[derive(Debug, Clone)]
pub(crate) enum AddrRefusal {
    /// Resolution failed or returned nothing (a 502, not a policy refusal).
    Unresolvable(String),
    /// An address is in a special range not allowed by the operator.
    Special { addr: IpAddr, range: String },
}

impl Resolver {
    /// Resolves `host` and checks every address. An IP literal is only checked.
    pub(crate) async fn resolve_checked(&self, host: &Host, port: u16) -> Result<Checked, AddrRefusal> {
        let addrs = match host {
            Host::Ip(ip) => vec![*ip],
            Host::Name(name) => self.lookup(name, port).await?,
        };
        self.check(&addrs)
    }

    async fn lookup(&self, name: &str, port: u16) -> Result<Vec<IpAddr>, AddrRefusal> {
        if let Some(addrs) = self.hosts.get(name) {
            return Ok(addrs.clone());
        }
        let lookup = tokio::net::lookup_host((name, port));
        let found = match tokio::time::timeout(self.timeout, lookup).await {
            Err(_) => return Err(AddrRefusal::Unresolvable(format!("resolving {name} timed out"))),
            Ok(Err(e)) => return Err(AddrRefusal::Unresolvable(format!("cannot resolve {name}: {e}"))),
            Ok(Ok(found)) => found,
        };
        let mut addrs: Vec<IpAddr> = Vec::new();
        for sa in found {
            if !addrs.contains(&sa.ip()) {
                addrs.push(sa.ip());
            }
        }
        if addrs.is_empty() {
            return Err(AddrRefusal::Unresolvable(format!("{name} has no addresses")));
        }
        Ok(addrs)
    }

    /// Refuses if ANY address is special (or the host's own) and not allowed; returns the addresses to connect
    /// to (mapped and compatible IPv6 forms replaced by the IPv4 address they stand for). An address of the host
    /// itself is allowed only by an `allow_cidrs` entry naming exactly that address.
    pub(crate) fn check(&self, addrs: &[IpAddr]) -> Result<Checked, AddrRefusal> {
        let mut out = Vec::with_capacity(addrs.len());
        let mut via_cidr = None;
        for &addr in addrs {
            let effective = unmap(addr);
            // An address of the host itself needs an allow_cidrs entry naming exactly it: allowing a network
            // that happens to contain the host does not open the host's own services.
            let local = is_local(connect_form(addr));
            let range = match (special_range(addr), local) {
                (Some(special), true) => Some(format!("{special}, {LOCAL}")),
                (special, false) => special,
                (None, true) => Some(LOCAL.to_owned()),
            };
            if let Some(range) = range {
                let listed = |net: &&IpNet| {
                    (net.contains(&addr) || net.contains(&effective))
                        && (!local || net.prefix_len() == net.max_prefix_len())
                };
                match self.allow_cidrs.iter().find(listed) {
                    Some(net) => {
                        via_cidr.get_or_insert_with(|| format!("{addr} in egress.allow_cidrs {net}"));
                    }
                    None => return Err(AddrRefusal::Special { addr, range }),
                }
            }
            out.push(connect_form(addr));
        }
        Ok(Checked { addrs: out, via_cidr })
    }
}

/// Mapped/compatible IPv6 is connected to as the IPv4 address it names; NAT64 stays IPv6 (it needs the
/// translator).
fn connect_form(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) if u128::from(v6) >> 32 <= 0xffff => unmap(addr),
        _ => addr,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn resolver(cidrs: &[&str]) -> Resolver {
        Resolver {
            hosts: HashMap::from([("meta.test".to_owned(), vec!["169.254.169.254".parse().unwrap()])]),
            allow_cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
            timeout: Duration::from_secs(1),
        }
    }

    fn ips(v: &[&str]) -> Vec<IpAddr> {
        v.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn any_special_address_refuses_the_whole_answer() {
        let r = resolver(&[]);
        assert!(r.check(&ips(&["8.8.8.8"])).is_ok());
        match r.check(&ips(&["8.8.8.8", "10.0.0.1"])) {
            Err(AddrRefusal::Special { addr, range }) => {
                assert_eq!(addr.to_string(), "10.0.0.1");
                assert_eq!(range, "private");
            }
            other => panic!("{other:?}"),
        }
        assert!(r.check(&ips(&["::ffff:127.0.0.1"])).is_err());
        assert!(r.check(&ips(&["64:ff9b::7f00:1"])).is_err());
    }

    #[test]
    fn allow_cidrs_let_listed_special_addresses_through_including_mapped_forms() {
        let r = resolver(&["127.0.0.1/32", "10.200.1.0/24"]);
        let ok = r.check(&ips(&["::ffff:127.0.0.1", "10.200.1.9"])).unwrap();
        assert_eq!(ok.addrs, ips(&["127.0.0.1", "10.200.1.9"]), "mapped forms connect as IPv4");
        assert!(ok.via_cidr.unwrap().contains("127.0.0.1/32"));
        assert!(r.check(&ips(&["127.0.0.2"])).is_err());
        assert!(r.check(&ips(&["169.254.169.254"])).is_err());
    }

    #[test]
    fn the_hosts_own_addresses_need_an_entry_naming_exactly_them() {
        // 127.0.0.1 is an address of this host: a range containing it is not enough, the address itself is.
        match resolver(&["127.0.0.0/8"]).check(&ips(&["127.0.0.1"])) {
            Err(AddrRefusal::Special { range, .. }) => assert!(range.contains("this host"), "{range}"),
            other => panic!("{other:?}"),
        }
        assert!(resolver(&["127.0.0.1/32"]).check(&ips(&["127.0.0.1"])).is_ok());
        assert!(resolver(&["127.0.0.1/32"]).check(&ips(&["::ffff:127.0.0.1"])).is_ok());
    }

    #[tokio::test]
    async fn static_entries_are_used_before_the_system_resolver() {
        let r = resolver(&[]);
        match r.resolve_checked(&Host::Name("meta.test".into()), 80).await {
            Err(AddrRefusal::Special { addr, range }) => {
                assert_eq!(addr.to_string(), "169.254.169.254");
                assert!(range.contains("metadata"));
            }
            other => panic!("{other:?}"),
        }
    }
}
