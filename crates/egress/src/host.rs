//! Canonical form of a requested host: one spelling per destination, so that policy matching and the
//! special-range check cannot be bypassed by writing the same address another way.
//!
//! Names are lowercased with one trailing dot stripped; non-ASCII is rejected (no IDNA). Anything whose last
//! label is a number is an IPv4 address parsed the way `inet_aton` does (`0x7f.1`, `2130706433`,
//! `017700000001`, `127.1`) or an error, as in the WHATWG URL standard. IPv6 may be bracketed and carry a zone
//! id; IPv4-mapped, IPv4-compatible and NAT64 (`64:ff9b::/96`) addresses become the IPv4 address they embed.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Longest host name accepted (DNS limit without the trailing dot).
const MAX_NAME_LEN: usize = 253;
/// Longest DNS label.
const MAX_LABEL_LEN: usize = 63;

/// A requested destination host in canonical form.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name: lowercase ASCII, no trailing dot, valid labels.
    Name(String),
    /// An IP literal (embedded IPv4 already extracted from mapped/compatible/NAT64 IPv6).
    Ip(IpAddr),
}

impl Host {
    /// The host as written in audit records: the name, or the address without brackets.
    pub fn audit_string(&self) -> String {
        match self {
            Host::Name(name) => name.clone(),
            Host::Ip(ip) => ip.to_string(),
        }
    }
}

impl fmt::Display for Host {
    /// The host as written in a URL authority (IPv6 in brackets).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

/// Why a host string is not a valid destination.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// Empty host.
    #[error("empty host")]
    Empty,
    /// Non-ASCII host; IDNA is not supported.
    #[error("host {0:?} is not ASCII: write internationalised names in their punycode form (xn--...)")]
    NotAscii(String),
    /// Ends in a number but is not an IPv4 address `inet_aton` would accept.
    #[error("host {0:?} ends in a number but is not a valid IPv4 address")]
    BadIpv4(String),
    /// Bracketed or colon-containing host that is not an IPv6 address.
    #[error("host {0:?} is not a valid IPv6 address")]
    BadIpv6(String),
    /// A name with a bad label or length.
    #[error("host {0:?} is not a valid DNS name: {1}")]
    BadName(String, &'static str),
}

/// Canonicalises a host as requested by a client (CONNECT authority host or absolute-URL host, no port).
pub fn canonicalize_host(raw: &str) -> Result<Host, HostError> {
    if raw.is_empty() {
        return Err(HostError::Empty);
    }
    if !raw.is_ascii() {
        return Err(HostError::NotAscii(truncated(raw)));
    }
    if let Some(inner) = raw.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or_else(|| HostError::BadIpv6(truncated(raw)))?;
        return parse_ipv6(inner).map(Host::Ip).ok_or_else(|| HostError::BadIpv6(truncated(raw)));
    }
    if raw.contains(':') {
        return parse_ipv6(raw).map(Host::Ip).ok_or_else(|| HostError::BadIpv6(truncated(raw)));
    }
    let lower = raw.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    if name.is_empty() {
        return Err(HostError::Empty);
    }
    if ends_in_number(name) {
        return inet_aton(name).map(|ip| Host::Ip(IpAddr::V4(ip))).ok_or_else(|| HostError::BadIpv4(truncated(raw)));
    }
    validate_name(name).map_err(|why| HostError::BadName(truncated(raw), why))?;
    Ok(Host::Name(name.to_owned()))
}

/// Checks DNS name syntax: length, label lengths, label characters (letters, digits, `-`, `_`).
pub(crate) fn validate_name(name: &str) -> Result<(), &'static str> {
    if name.len() > MAX_NAME_LEN {
        return Err("longer than 253 characters");
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("empty label");
        }
        if label.len() > MAX_LABEL_LEN {
            return Err("label longer than 63 characters");
        }
        if !label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_') {
            return Err("labels may contain only letters, digits, '-' and '_'");
        }
    }
    Ok(())
}

/// The address an IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`) or NAT64 (`64:ff9b::a.b.c.d`)
/// IPv6 address stands for; other addresses are returned unchanged.
pub fn unmap(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => embedded_ipv4(v6).map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// The IPv4 address embedded in a mapped, compatible or NAT64 IPv6 address.
pub(crate) fn embedded_ipv4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = u128::from(v6);
    let low = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
    let high = bits >> 32;
    match high {
        0xffff => Some(low),
        // `::` and `::1` are IPv6's own unspecified and loopback addresses, not compatible forms.
        0 if bits > 1 => Some(low),
        0x0064_ff9b_0000_0000_0000_0000 => Some(low),
        _ => None,
    }
}

fn parse_ipv6(s: &str) -> Option<IpAddr> {
    // Zone ids (`fe80::1%eth0`, or `%25eth0` in a URL) do not change which range the address is in.
    let addr = s.split('%').next().unwrap_or(s);
    addr.parse::<Ipv6Addr>().ok().map(|v6| unmap(IpAddr::V6(v6)))
}

/// WHATWG "ends in a number": the last label is all digits or `0x` followed by hex digits.
fn ends_in_number(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name);
    if !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    last.strip_prefix("0x").is_some_and(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// IPv4 parsing as glibc `inet_aton`: 1 to 4 parts, each decimal, octal (leading `0`) or hex (`0x`); the last
/// part fills the remaining bytes (`a`, `a.b` with b 24 bits, `a.b.c` with c 16 bits, `a.b.c.d`).
pub(crate) fn inet_aton(s: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut values = Vec::with_capacity(parts.len());
    for part in &parts {
        values.push(parse_part(part)?);
    }
    let (last, leading) = values.split_last()?;
    let mut addr: u32 = 0;
    for (i, v) in leading.iter().enumerate() {
        if *v > 0xff {
            return None;
        }
        addr |= (*v as u32) << (24 - 8 * i);
    }
    let last_bits = 32 - 8 * leading.len();
    let max = if last_bits == 32 { u64::from(u32::MAX) } else { (1u64 << last_bits) - 1 };
    if *last > max {
        return None;
    }
    addr |= *last as u32;
    Some(Ipv4Addr::from(addr))
}

fn parse_part(part: &str) -> Option<u64> {
    if part.is_empty() || part.len() > 34 {
        return None;
    }
    let (digits, radix) = if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
        (hex, 16)
    } else if part.len() > 1 && part.starts_with('0') {
        (&part[1..], 8)
    } else {
        (part, 10)
    };
    if digits.is_empty() {
        // `0x` alone is 0 for inet_aton.
        return Some(0);
    }
    let value = u64::from_str_radix(digits, radix).ok()?;
    (value <= u64::from(u32::MAX)).then_some(value)
}

fn truncated(s: &str) -> String {
    s.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn ip(s: &str) -> Host {
        Host::Ip(s.parse().unwrap())
    }

    #[test]
    fn names_are_lowercased_and_lose_one_trailing_dot() {
        assert_eq!(canonicalize_host("API.Example.COM.").unwrap(), Host::Name("api.example.com".into()));
        assert!(canonicalize_host("example.com..").is_err());
        assert!(canonicalize_host(".").is_err());
    }

    #[test]
    fn odd_ipv4_spellings_parse_like_inet_aton() {
        for spelling in ["127.0.0.1", "0x7f.1", "2130706433", "017700000001", "127.1", "0x7f000001", "0177.0.0.01"] {
            assert_eq!(canonicalize_host(spelling).unwrap(), ip("127.0.0.1"), "{spelling}");
        }
        assert_eq!(canonicalize_host("0X7F.0.0.1.").unwrap(), ip("127.0.0.1"));
        assert_eq!(canonicalize_host("169.254.43518").unwrap(), ip("169.254.169.254"));
        assert_eq!(canonicalize_host("0xa9.0xfe.0xa9.0xfe").unwrap(), ip("169.254.169.254"));
        assert_eq!(canonicalize_host("10.1.2").unwrap(), ip("10.1.0.2"));
        assert_eq!(canonicalize_host("0").unwrap(), ip("0.0.0.0"));
        assert_eq!(canonicalize_host("0x").unwrap(), ip("0.0.0.0"));
    }

    #[test]
    fn invalid_ipv4_that_ends_in_a_number_is_an_error_not_a_name() {
        for bad in ["256.0.0.1", "1.2.3.4.5", "08.1.1.1", "4294967296", "1.16777216", "1..1", "foo.123", "0x1g.1"] {
            assert!(canonicalize_host(bad).is_err(), "{bad} should be rejected");
        }
        // A label that merely contains digits is a name.
        assert_eq!(canonicalize_host("123abc.example").unwrap(), Host::Name("123abc.example".into()));
    }

    #[test]
    fn ipv6_forms_are_canonical_and_mapped_forms_unmap() {
        assert_eq!(canonicalize_host("[::1]").unwrap(), ip("::1"));
        assert_eq!(canonicalize_host("[0:0:0:0:0:0:0:1]").unwrap(), ip("::1"));
        assert_eq!(canonicalize_host("[fe80::1%25eth0]").unwrap(), ip("fe80::1"));
        assert_eq!(canonicalize_host("fe80::1%eth0").unwrap(), ip("fe80::1"));
        assert_eq!(canonicalize_host("[::ffff:127.0.0.1]").unwrap(), ip("127.0.0.1"));
        assert_eq!(canonicalize_host("[::ffff:7f00:1]").unwrap(), ip("127.0.0.1"));
        assert_eq!(canonicalize_host("[::127.0.0.1]").unwrap(), ip("127.0.0.1"));
        assert_eq!(canonicalize_host("[64:ff9b::a9fe:a9fe]").unwrap(), ip("169.254.169.254"));
        assert_eq!(canonicalize_host("[2001:DB8::1]").unwrap(), ip("2001:db8::1"));
        assert!(canonicalize_host("[::1").is_err());
        assert!(canonicalize_host("[example.com]").is_err());
    }

    #[test]
    fn non_ascii_and_bad_names_are_rejected_with_a_reason() {
        let err = canonicalize_host("bücher.example").unwrap_err();
        assert!(err.to_string().contains("punycode"), "{err}");
        assert!(canonicalize_host("a b.example").is_err());
        assert!(canonicalize_host(&"a".repeat(64)).is_err());
        assert!(canonicalize_host("").is_err());
        assert!(canonicalize_host("*.example.com").is_err());
    }

    #[test]
    fn random_hosts_never_panic_and_canonical_forms_are_fixed_points() {
        let alphabet = b".0x1fFX79:[]%a-_Z";
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let len = (state % 24) as usize;
            let s: String =
                (0..len).map(|i| alphabet[((state >> (i % 8 * 8)) as usize + i) % alphabet.len()] as char).collect();
            if let Ok(host) = canonicalize_host(&s) {
                assert_eq!(canonicalize_host(&host.to_string()).unwrap(), host, "{s:?}");
            }
        }
    }
}
