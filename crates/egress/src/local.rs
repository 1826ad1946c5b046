//! Whether an address belongs to the proxy's own host. The proxy runs on the host, so a connection to any of the
//! host's addresses reaches the host's own services (those bound to `0.0.0.0`, say), behind no outside firewall —
//! and that holds for a public address of the host as much as for a private one inside a range the operator
//! allowed for other machines.
//!
//! The kernel is asked, not a list of interfaces made at start: a UDP socket "connected" to one of the host's
//! addresses gets that same address as its source (the kernel's local routes carry it as the preferred source).
//! Connecting a UDP socket sends nothing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

/// Whether `addr` is an address of this host (as routed now). Unroutable addresses are not (a connection to
/// them fails anyway). Every loopback address (all of 127.0.0.0/8, `::1`) and the unspecified ones (`0.0.0.0/8`,
/// `::`) reach the host too, though the kernel answers them from `127.0.0.1`: they are local without asking.
pub(crate) fn is_local(addr: IpAddr) -> bool {
    let always = match addr {
        IpAddr::V4(v4) => v4.is_loopback() || v4.octets()[0] == 0,
        IpAddr::V6(v6) => v6.is_loopback() || v6.is_unspecified(),
    };
    if always {
        return true;
    }
    let any: IpAddr = match addr {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let Ok(socket) = UdpSocket::bind(SocketAddr::new(any, 0)) else { return false };
    if socket.connect(SocketAddr::new(addr, 9)).is_err() {
        return false;
    }
    socket.local_addr().is_ok_and(|local| local.ip() == addr)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn loopback_is_local_and_unroutable_addresses_are_not() {
        for local in ["127.0.0.1", "127.0.0.2", "127.255.255.254", "0.0.0.0", "0.1.2.3", "::1", "::"] {
            assert!(is_local(local.parse().unwrap()), "{local}");
        }
        // Documentation addresses: never assigned here, and with no route the answer is still "not local".
        assert!(!is_local("192.0.2.1".parse().unwrap()));
    }
}
