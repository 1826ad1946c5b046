//! Special-purpose address ranges the proxy never connects to unless the operator lists them in
//! `egress.allow_cidrs`: loopback, private, link-local (cloud metadata), CGNAT, ULA, multicast, reserved,
//! documentation and benchmarking ranges, the IPv6 forms that embed such an IPv4 address, and any IPv6 address
//! outside global unicast (2000::/3).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::host::embedded_ipv4;

/// IPv4 special ranges: (network, prefix length, name). The first match names the range.
const V4: &[(Ipv4Addr, u8, &str)] = &[
    (Ipv4Addr::new(169, 254, 169, 254), 32, "link-local, cloud metadata endpoint"),
    (Ipv4Addr::new(255, 255, 255, 255), 32, "broadcast"),
    (Ipv4Addr::new(0, 0, 0, 0), 8, "\"this network\" 0.0.0.0/8"),
    (Ipv4Addr::new(10, 0, 0, 0), 8, "private"),
    (Ipv4Addr::new(100, 64, 0, 0), 10, "carrier-grade NAT"),
    (Ipv4Addr::new(127, 0, 0, 0), 8, "loopback"),
    (Ipv4Addr::new(169, 254, 0, 0), 16, "link-local"),
    (Ipv4Addr::new(172, 16, 0, 0), 12, "private"),
    (Ipv4Addr::new(192, 0, 0, 0), 24, "IETF protocol assignments"),
    (Ipv4Addr::new(192, 0, 2, 0), 24, "documentation"),
    (Ipv4Addr::new(192, 88, 99, 0), 24, "6to4 relay anycast"),
    (Ipv4Addr::new(192, 168, 0, 0), 16, "private"),
    (Ipv4Addr::new(198, 18, 0, 0), 15, "benchmarking"),
    (Ipv4Addr::new(198, 51, 100, 0), 24, "documentation"),
    (Ipv4Addr::new(203, 0, 113, 0), 24, "documentation"),
    (Ipv4Addr::new(224, 0, 0, 0), 4, "multicast"),
    (Ipv4Addr::new(240, 0, 0, 0), 4, "reserved"),
];

/// IPv6 special ranges (the embedded-IPv4 forms are handled before this table; anything else outside global
/// unicast 2000::/3 is refused after it).
const V6: &[(u128, u8, &str)] = &[
    (0, 128, "unspecified"),
    (1, 128, "loopback"),
    (0x0064_ff9b_0001 << 80, 48, "NAT64 local-use"),
    (0x0100 << 112, 64, "discard-only"),
    (0x2001 << 112, 23, "IETF protocol assignments"),
    (0x2001_0db8 << 96, 32, "documentation"),
    (0x3fff << 112, 20, "documentation"),
    (0xfc00 << 112, 7, "unique local"),
    (0xfe80 << 112, 10, "link-local"),
    (0xfec0 << 112, 10, "site-local"),
    (0xff00 << 112, 8, "multicast"),
];

/// Names the special range `ip` is in, or `None` for a public address. Mapped, compatible, NAT64 and 6to4
/// IPv6 addresses are judged by the IPv4 address they embed.
pub fn special_range(ip: IpAddr) -> Option<String> {
    match ip {
        IpAddr::V4(v4) => v4_range(v4).map(str::to_owned),
        IpAddr::V6(v6) => {
            if let Some(v4) = embedded_ipv4(v6) {
                return v4_range(v4).map(|name| format!("{} form of {v4}, {name}", embedded_form(v6)));
            }
            let bits = u128::from(v6);
            if bits >> 112 == 0x2002 {
                let v4 = Ipv4Addr::from(((bits >> 80) & 0xffff_ffff) as u32);
                return v4_range(v4).map(|name| format!("6to4 form of {v4}, {name}"));
            }
            let named = V6.iter().find(|(net, len, _)| in_prefix(bits, *net, *len, 128));
            if let Some((_, _, name)) = named {
                return Some((*name).to_owned());
            }
            // Global unicast is 2000::/3; everything else (SIIT ::ffff:0:0/96, SRv6 5f00::/16, unassigned space)
            // is nobody's public address.
            (!in_prefix(bits, 0x2000 << 112, 3, 128)).then(|| "not global unicast (outside 2000::/3)".to_owned())
        }
    }
}

fn v4_range(v4: Ipv4Addr) -> Option<&'static str> {
    let bits = u128::from(u32::from(v4));
    V4.iter().find(|(net, len, _)| in_prefix(bits, u128::from(u32::from(*net)), *len, 32)).map(|(_, _, name)| *name)
}

fn embedded_form(v6: Ipv6Addr) -> &'static str {
    match u128::from(v6) >> 32 {
        0xffff => "IPv4-mapped",
        0 => "IPv4-compatible",
        _ => "NAT64",
    }
}

fn in_prefix(bits: u128, net: u128, len: u8, width: u8) -> bool {
    let shift = u32::from(width - len);
    if shift >= 128 {
        return true;
    }
    (bits >> shift) == (net >> shift)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn range(s: &str) -> Option<String> {
        special_range(s.parse().unwrap())
    }

    #[test]
    fn every_special_ipv4_range_is_named() {
        let cases = [
            ("0.0.0.0", "this network"),
            ("0.1.2.3", "this network"),
            ("10.200.1.2", "private"),
            ("100.64.0.1", "carrier-grade NAT"),
            ("100.127.255.254", "carrier-grade NAT"),
            ("127.0.0.1", "loopback"),
            ("127.255.0.9", "loopback"),
            ("169.254.169.254", "cloud metadata"),
            ("169.254.1.1", "link-local"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.0.0.8", "IETF"),
            ("192.0.2.1", "documentation"),
            ("192.88.99.1", "6to4"),
            ("192.168.1.1", "private"),
            ("198.18.0.1", "benchmarking"),
            ("198.19.255.1", "benchmarking"),
            ("198.51.100.7", "documentation"),
            ("203.0.113.9", "documentation"),
            ("224.0.0.1", "multicast"),
            ("239.255.255.250", "multicast"),
            ("240.0.0.1", "reserved"),
            ("255.255.255.255", "broadcast"),
        ];
        for (addr, want) in cases {
            let got = range(addr).unwrap_or_else(|| panic!("{addr} not special"));
            assert!(got.contains(want), "{addr}: {got}");
        }
    }

    #[test]
    fn public_addresses_are_not_special() {
        for addr in
            ["1.1.1.1", "8.8.8.8", "100.63.255.255", "100.128.0.0", "172.15.255.255", "172.32.0.0", "2606:4700::1111"]
        {
            assert_eq!(range(addr), None, "{addr}");
        }
    }

    #[test]
    fn every_special_ipv6_range_is_named() {
        let cases = [
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
            ("fc00::1", "unique local"),
            ("fd12:3456::1", "unique local"),
            ("ff02::1", "multicast"),
            ("2001:db8::1", "documentation"),
            ("3fff::1", "documentation"),
            ("100::1", "discard"),
            ("64:ff9b:1::1", "NAT64 local-use"),
            ("fec0::1", "site-local"),
            ("2001::1", "IETF"),
            ("::ffff:0:7f00:1", "outside 2000::/3"),
            ("5f00::1", "outside 2000::/3"),
            ("4000::1", "outside 2000::/3"),
            ("::1:0:0:1", "outside 2000::/3"),
        ];
        for (addr, want) in cases {
            let got = range(addr).unwrap_or_else(|| panic!("{addr} not special"));
            assert!(got.contains(want), "{addr}: {got}");
        }
    }

    #[test]
    fn mapped_compatible_nat64_and_6to4_forms_are_judged_by_their_ipv4() {
        let cases = [
            ("::ffff:127.0.0.1", "IPv4-mapped form of 127.0.0.1, loopback"),
            ("::ffff:169.254.169.254", "cloud metadata"),
            ("::10.0.0.1", "IPv4-compatible form of 10.0.0.1, private"),
            ("64:ff9b::a9fe:a9fe", "NAT64 form of 169.254.169.254"),
            ("64:ff9b::192.168.0.1", "private"),
            ("2002:7f00:1::1", "6to4 form of 127.0.0.1, loopback"),
        ];
        for (addr, want) in cases {
            let got = range(addr).unwrap_or_else(|| panic!("{addr} not special"));
            assert!(got.contains(want), "{addr}: {got}");
        }
        assert_eq!(range("::ffff:8.8.8.8"), None);
        assert_eq!(range("64:ff9b::8.8.8.8"), None);
    }
}
