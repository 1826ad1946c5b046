//! Name resolution done by the proxy itself (static entries first, then the system resolver, always with the name
//! made absolute so that the resolver's search domains cannot change which host an allowed name reaches) and the
//! address-level check: every resolved address must be public or inside an operator-allowed CIDR. The checked
//! addresses are the only ones the proxy then connects to, so a second (rebinding) lookup never happens.
//!
//! A system lookup blocks a thread until the resolver gives up, which a name under a domain whose name servers
//! never answer makes long; giving up waiting does not free that thread. So lookups in flight are capped, per
//! sandbox and for the whole proxy, and a lookup holds its place until it really ends: a sandbox cannot pile up
//! blocked threads and starve the server's other blocking work (or other sandboxes' lookups).

use std::collections::HashMap;
use std::net::{IpAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use tokio::sync::Semaphore;

use crate::host::{Host, unmap};
use crate::local::is_local;
use crate::ranges::special_range;

/// How a refusal names an address of the proxy's own host.
const LOCAL: &str = "an address of this host (the proxy's own)";

/// System lookups in flight for the whole proxy.
const MAX_LOOKUPS: usize = 64;
/// System lookups in flight for one sandbox.
pub(crate) const MAX_LOOKUPS_PER_SANDBOX: usize = 8;

/// A blocking name lookup (the system resolver; a stand-in in tests).
type SystemLookup = fn(&str, u16) -> std::io::Result<Vec<IpAddr>>;

fn system_lookup(name: &str, port: u16) -> std::io::Result<Vec<IpAddr>> {
    Ok((name, port).to_socket_addrs()?.map(|sa| sa.ip()).collect())
}

/// The proxy's resolver and address policy.
#[derive(Debug, Clone)]
pub(crate) struct Resolver {
    pub(crate) hosts: HashMap<String, Vec<IpAddr>>,
    pub(crate) allow_cidrs: Vec<IpNet>,
    pub(crate) timeout: Duration,
    lookups: Arc<Semaphore>,
    system: SystemLookup,
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
    /// A resolver with static entries, allowed special CIDRs and a timeout for each lookup.
    pub(crate) fn new(hosts: HashMap<String, Vec<IpAddr>>, allow_cidrs: Vec<IpNet>, timeout: Duration) -> Resolver {
        Resolver { hosts, allow_cidrs, timeout, lookups: Arc::new(Semaphore::new(MAX_LOOKUPS)), system: system_lookup }
    }

    /// Resolves `host` and checks every address. An IP literal is only checked. `sandbox_lookups` caps the
    /// sandbox's system lookups in flight.
    pub(crate) async fn resolve_checked(
        &self,
        host: &Host,
        port: u16,
        sandbox_lookups: &Arc<Semaphore>,
    ) -> Result<Checked, AddrRefusal> {
        let addrs = match host {
            Host::Ip(ip) => vec![*ip],
            Host::Name(name) => self.lookup(name, port, sandbox_lookups).await?,
        };
        self.check(&addrs)
    }

    async fn lookup(
        &self,
        name: &str,
        port: u16,
        sandbox_lookups: &Arc<Semaphore>,
    ) -> Result<Vec<IpAddr>, AddrRefusal> {
        if let Some(addrs) = self.hosts.get(name) {
            return Ok(addrs.clone());
        }
        // `localhost` and its subdomains are loopback by definition (RFC 6761), whatever a resolver says; the absolute
        // lookup below would not find them in /etc/hosts.
        let bare = name.trim_end_matches('.');
        if bare == "localhost" || bare.ends_with(".localhost") {
            return Ok(vec![IpAddr::from([127, 0, 0, 1]), IpAddr::from(std::net::Ipv6Addr::LOCALHOST)]);
        }
        let deadline = tokio::time::Instant::now() + self.timeout;
        let busy = || AddrRefusal::Unresolvable(format!("resolving {name}: too many name lookups in flight"));
        let places = tokio::time::timeout_at(deadline, async {
            let mine = sandbox_lookups.clone().acquire_owned().await.ok()?;
            let all = self.lookups.clone().acquire_owned().await.ok()?;
            Some((mine, all))
        });
        let places = places.await.ok().flatten().ok_or_else(busy)?;
        // Absolute (a trailing dot): the resolver's search domains never turn an allowed name into another one.
        let absolute = if name.ends_with('.') { name.to_owned() } else { format!("{name}.") };
        let (system, owned) = (self.system, absolute);
        let lookup = tokio::task::spawn_blocking(move || {
            // The places are given back when the lookup really ends, not when the proxy stops waiting for it.
            let _places = places;
            system(&owned, port)
        });
        let found = match tokio::time::timeout_at(deadline, lookup).await {
            Err(_) => return Err(AddrRefusal::Unresolvable(format!("resolving {name} timed out"))),
            Ok(Err(e)) => return Err(AddrRefusal::Unresolvable(format!("cannot resolve {name}: {e}"))),
            Ok(Ok(Err(e))) => return Err(AddrRefusal::Unresolvable(format!("cannot resolve {name}: {e}"))),
            Ok(Ok(Ok(found))) => found,
        };
        let mut addrs: Vec<IpAddr> = Vec::new();
        for ip in found {
            if !addrs.contains(&ip) {
                addrs.push(ip);
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
        Resolver::new(
            HashMap::from([("meta.test".to_owned(), vec!["169.254.169.254".parse().unwrap()])]),
            cidrs.iter().map(|c| c.parse().unwrap()).collect(),
            Duration::from_secs(1),
        )
    }

    fn sandbox_lookups() -> Arc<Semaphore> {
        Arc::new(Semaphore::new(MAX_LOOKUPS_PER_SANDBOX))
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
        // Loopback aliases and 0.0.0.0 reach the host's services just the same (the kernel answers them from
        // 127.0.0.1), so a wide range does not open them either.
        for wide in ["127.0.0.0/8", "0.0.0.0/8", "0.0.0.0/0"] {
            for addr in ["127.0.0.2", "0.0.0.0", "::ffff:127.0.0.3"] {
                assert!(resolver(&[wide]).check(&ips(&[addr])).is_err(), "{addr} through {wide}");
            }
        }
        assert!(resolver(&["127.0.0.1/32"]).check(&ips(&["127.0.0.1"])).is_ok());
        assert!(resolver(&["127.0.0.1/32"]).check(&ips(&["::ffff:127.0.0.1"])).is_ok());
    }

    #[tokio::test]
    async fn static_entries_are_used_before_the_system_resolver() {
        let r = resolver(&[]);
        match r.resolve_checked(&Host::Name("meta.test".into()), 80, &sandbox_lookups()).await {
            Err(AddrRefusal::Special { addr, range }) => {
                assert_eq!(addr.to_string(), "169.254.169.254");
                assert!(range.contains("metadata"));
            }
            other => panic!("{other:?}"),
        }
    }

    /// A lookup that blocks until the test opens the gate (a name server that never answers), counting calls.
    static GATE: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    fn hanging_lookup(_: &str, _: u16) -> std::io::Result<Vec<IpAddr>> {
        CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        while !*GATE.lock().unwrap_or_else(|e| e.into_inner()) {
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(vec!["8.8.8.8".parse().unwrap()])
    }

    /// Opens the gate when dropped, so that a failing test does not leave threads blocked forever.
    struct OpenGate;

    impl Drop for OpenGate {
        fn drop(&mut self) {
            *GATE.lock().unwrap_or_else(|e| e.into_inner()) = true;
        }
    }

    #[tokio::test]
    async fn lookups_that_never_answer_cannot_pile_up_blocked_threads() {
        let _open_at_the_end = OpenGate;
        let mut r = resolver(&[]);
        r.timeout = Duration::from_millis(100);
        r.system = hanging_lookup;
        let mine = sandbox_lookups();
        let calls = || CALLS.load(std::sync::atomic::Ordering::SeqCst);
        // Each lookup times out for the proxy, but its thread stays blocked, and keeps its place.
        for n in 0..MAX_LOOKUPS_PER_SANDBOX + 4 {
            let err = r.resolve_checked(&Host::Name(format!("n{n}.slow.test")), 443, &mine).await.unwrap_err();
            assert!(matches!(err, AddrRefusal::Unresolvable(_)), "{err:?}");
        }
        assert_eq!(calls(), MAX_LOOKUPS_PER_SANDBOX, "more blocked lookups than the sandbox may have");
        // Another sandbox still gets its own places.
        let other = sandbox_lookups();
        let _ = r.resolve_checked(&Host::Name("other.slow.test".into()), 443, &other).await;
        assert_eq!(calls(), MAX_LOOKUPS_PER_SANDBOX + 1);
        // Once the lookups really end, their places are free again.
        *GATE.lock().unwrap() = true;
        r.timeout = Duration::from_secs(5);
        let ok = r.resolve_checked(&Host::Name("after.slow.test".into()), 443, &mine).await.unwrap();
        assert_eq!(ok.addrs, ips(&["8.8.8.8"]));
    }

    fn recording_lookup(name: &str, _: u16) -> std::io::Result<Vec<IpAddr>> {
        ASKED.lock().unwrap_or_else(|e| e.into_inner()).push(name.to_owned());
        Ok(vec!["8.8.4.4".parse().unwrap()])
    }

    static ASKED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

    #[tokio::test]
    async fn the_system_resolver_is_asked_for_absolute_names_only() {
        let mut r = resolver(&[]);
        r.system = recording_lookup;
        for name in ["api", "api.example.test", "api.example.test."] {
            r.resolve_checked(&Host::Name(name.into()), 443, &sandbox_lookups()).await.unwrap();
        }
        let asked = ASKED.lock().unwrap().clone();
        assert_eq!(asked, ["api.", "api.example.test.", "api.example.test."], "search domains could apply");
    }
}
