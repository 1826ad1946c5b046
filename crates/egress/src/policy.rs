//! A sandbox's egress policy, compiled from its mode and allow/deny patterns, and the name-level decision
//! (before resolution; the address-level check is in `resolve.rs`).
//!
//! Pattern syntax: `api.example.com` (exactly that name), `*.example.org` (every subdomain, not the apex),
//! an IP literal `203.0.113.7` / `[2001:db8::1]` (exactly that address, canonicalised; a name pattern never
//! matches an IP literal and vice versa), each optionally followed by `:port`. Without a port a pattern
//! matches every port. Deny wins over allow, in every mode.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::host::{Host, canonicalize_host};

/// How much egress a sandbox gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Nothing leaves the sandbox (the default).
    #[default]
    None,
    /// Only destinations matching an allow pattern (and no deny pattern).
    Allowlist,
    /// Any public destination not matching a deny pattern.
    Open,
}

/// Why a policy could not be compiled: names the pattern and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {list} pattern {pattern:?}: {reason}")]
pub struct PolicyError {
    /// `allow`, `deny` or `secret hosts`.
    pub list: &'static str,
    /// The pattern as given.
    pub pattern: String,
    /// What is wrong and how to write it instead.
    pub reason: String,
}

/// One compiled host pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    text: String,
    target: Target,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Exact(String),
    /// Matches names ending in this suffix, which starts with a dot.
    Subdomains(String),
    Ip(IpAddr),
}

/// What a pattern's host part covers, in the terms of a CA's name constraints (RFC 5280 4.2.1.10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Subtree {
    /// A DNS name (a constraint `api.example.com` also covers names under it).
    Name(String),
    /// The names under a domain, written with a leading dot (`.example.org`), the apex excluded.
    Subdomains(String),
    /// One address.
    Ip(IpAddr),
}

impl Pattern {
    /// Parses a pattern; `list` only labels the error.
    pub fn parse(list: &'static str, text: &str) -> Result<Pattern, PolicyError> {
        let err = |reason: &str| PolicyError { list, pattern: text.to_owned(), reason: reason.to_owned() };
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(err("empty pattern: write a host name like api.example.com or *.example.org"));
        }
        if !trimmed.is_ascii() {
            return Err(err("not ASCII: write internationalised names in their punycode form (xn--...)"));
        }
        let (host, port) = split_port(trimmed).map_err(|why| err(&why))?;
        if host == "*" {
            return Err(err("a bare * is not a pattern: use mode open to allow every public destination"));
        }
        if host.contains('/') {
            return Err(err("CIDR ranges are not patterns: list single hosts; the operator allows private CIDRs \
                 with egress.allow_cidrs"));
        }
        let target = if let Some(suffix) = host.strip_prefix("*.") {
            match canonicalize_host(suffix) {
                Ok(Host::Name(name)) => Target::Subdomains(format!(".{name}")),
                Ok(Host::Ip(_)) => return Err(err("a wildcard needs a domain after *., not an IP address")),
                Err(e) => return Err(err(&format!("{e}; write *.example.org"))),
            }
        } else if host.contains('*') {
            return Err(err("* is only allowed as the whole first label, as in *.example.org"));
        } else {
            match canonicalize_host(host) {
                Ok(Host::Name(name)) => Target::Exact(name),
                Ok(Host::Ip(ip)) => Target::Ip(ip),
                Err(e) => return Err(err(&e.to_string())),
            }
        };
        Ok(Pattern { text: trimmed.to_owned(), target, port })
    }

    /// Whether this pattern matches the canonical host and port.
    pub fn matches(&self, host: &Host, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        match (&self.target, host) {
            (Target::Exact(want), Host::Name(name)) => want == name,
            (Target::Subdomains(suffix), Host::Name(name)) => name.len() > suffix.len() && name.ends_with(suffix),
            (Target::Ip(want), Host::Ip(ip)) => want == ip,
            _ => false,
        }
    }

    /// The port the pattern names, if it names one.
    pub(crate) fn port(&self) -> Option<u16> {
        self.port
    }

    /// The hosts the pattern covers, as a certificate name constraint can say it.
    pub(crate) fn subtree(&self) -> Subtree {
        match &self.target {
            Target::Exact(name) => Subtree::Name(name.clone()),
            Target::Subdomains(suffix) => Subtree::Subdomains(suffix.clone()),
            Target::Ip(ip) => Subtree::Ip(*ip),
        }
    }

    /// For a wildcard pattern, how many labels follow `*.` (1 for `*.com`); `None` otherwise.
    pub(crate) fn wildcard_labels(&self) -> Option<usize> {
        match &self.target {
            Target::Subdomains(suffix) => Some(suffix.matches('.').count()),
            _ => None,
        }
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// Splits an optional `:port` off a pattern (IPv6 literals must be bracketed to carry a port).
fn split_port(text: &str) -> Result<(&str, Option<u16>), String> {
    let (host, port) = if text.starts_with('[') {
        match text.find(']') {
            Some(end) if end + 1 == text.len() => (text, None),
            Some(end) => match text[end + 1..].strip_prefix(':') {
                Some(port) => (&text[..=end], Some(port)),
                None => return Err("unexpected text after ]: write [2001:db8::1]:443".into()),
            },
            None => return Err("unclosed [: write IPv6 addresses as [2001:db8::1]".into()),
        }
    } else if text.matches(':').count() > 1 {
        (text, None)
    } else {
        match text.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => return Err(format!("bad port {p:?}: a port is a number from 1 to 65535")),
            Ok(n) => Some(n),
        },
    };
    Ok((host, port))
}

/// A compiled egress policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    mode: Mode,
    allow: Vec<Pattern>,
    deny: Vec<Pattern>,
}

/// The name-level verdict: allowed (with the rule) or refused (with the rule and the reason for the client).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NameVerdict {
    Allowed { rule: String },
    Refused { rule: String, reason: String },
}

impl Policy {
    /// Compiles a policy. `allow` is only meaningful for `Mode::Allowlist`; giving allow patterns with another
    /// mode is an error rather than silently ignored.
    pub fn compile(mode: Mode, allow: &[String], deny: &[String]) -> Result<Policy, PolicyError> {
        if mode != Mode::Allowlist
            && let Some(first) = allow.first()
        {
            let reason = match mode {
                Mode::None => "mode none refuses everything: use mode allowlist to allow listed hosts",
                _ => "mode open already allows every public destination: use mode allowlist to restrict to a list",
            };
            return Err(PolicyError { list: "allow", pattern: first.clone(), reason: reason.into() });
        }
        let allow = allow.iter().map(|p| Pattern::parse("allow", p)).collect::<Result<_, _>>()?;
        let deny = deny.iter().map(|p| Pattern::parse("deny", p)).collect::<Result<_, _>>()?;
        Ok(Policy { mode, allow, deny })
    }

    /// The policy that refuses everything.
    pub fn none() -> Policy {
        Policy { mode: Mode::None, allow: Vec::new(), deny: Vec::new() }
    }

    /// The policy's mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The allow patterns as written.
    pub fn allow(&self) -> Vec<String> {
        self.allow.iter().map(|p| p.text.clone()).collect()
    }

    /// The deny patterns as written.
    pub fn deny(&self) -> Vec<String> {
        self.deny.iter().map(|p| p.text.clone()).collect()
    }

    /// A deny pattern naming one of the addresses a destination resolved to (an IP deny pattern holds for every
    /// name that resolves to it, not only for the address typed literally); `(rule, reason)` when one does.
    pub(crate) fn denied_address(&self, addrs: &[IpAddr], port: u16) -> Option<(String, String)> {
        addrs.iter().find_map(|&addr| {
            let host = Host::Ip(addr);
            self.deny.iter().find(|p| p.matches(&host, port)).map(|p| {
                (format!("deny {:?}", p.text), format!("resolves to {addr}, which matches deny pattern {:?}", p.text))
            })
        })
    }

    /// Whether the policy lets the sandbox reach this name and port (before resolution and the address checks).
    pub fn permits_name(&self, host: &Host, port: u16) -> bool {
        matches!(self.check(host, port), NameVerdict::Allowed { .. })
    }

    /// Decides on the canonical host and port, before any resolution.
    pub(crate) fn check(&self, host: &Host, port: u16) -> NameVerdict {
        if self.mode == Mode::None {
            return NameVerdict::Refused {
                rule: "mode none".into(),
                reason: "this sandbox's network mode is none (no egress)".into(),
            };
        }
        if let Some(p) = self.deny.iter().find(|p| p.matches(host, port)) {
            return NameVerdict::Refused {
                rule: format!("deny {:?}", p.text),
                reason: format!("matches deny pattern {:?}", p.text),
            };
        }
        match self.mode {
            Mode::Open => NameVerdict::Allowed { rule: "mode open".into() },
            _ => match self.allow.iter().find(|p| p.matches(host, port)) {
                Some(p) => NameVerdict::Allowed { rule: format!("allow {:?}", p.text) },
                None => NameVerdict::Refused { rule: "not in allowlist".into(), reason: "not in the allowlist".into() },
            },
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_owned()).collect()
    }

    fn host(h: &str) -> Host {
        canonicalize_host(h).unwrap()
    }

    fn allowed(p: &Policy, h: &str, port: u16) -> bool {
        matches!(p.check(&host(h), port), NameVerdict::Allowed { .. })
    }

    #[test]
    fn exact_and_wildcard_patterns() {
        let p = Policy::compile(Mode::Allowlist, &s(&["API.example.com.", "*.example.org"]), &[]).unwrap();
        assert!(allowed(&p, "api.example.com", 443));
        assert!(allowed(&p, "Api.Example.Com.", 8080), "no port means any port");
        assert!(!allowed(&p, "x.api.example.com", 443));
        assert!(!allowed(&p, "example.com", 443));
        assert!(allowed(&p, "a.example.org", 443));
        assert!(allowed(&p, "a.b.example.org", 80));
        assert!(!allowed(&p, "example.org", 443), "wildcard is subdomains only");
        assert!(!allowed(&p, "badexample.org", 443));
        assert!(!allowed(&p, "example.org.evil.test", 443));
    }

    #[test]
    fn ports_restrict_a_pattern() {
        let p = Policy::compile(Mode::Allowlist, &s(&["*.example.org:443", "[2001:db8::1]:8443"]), &[]).unwrap();
        assert!(allowed(&p, "a.example.org", 443));
        assert!(!allowed(&p, "a.example.org", 80));
        assert!(allowed(&p, "[2001:db8::1]", 8443));
        assert!(!allowed(&p, "[2001:db8::1]", 443));
    }

    #[test]
    fn deny_wins_over_allow_and_in_open_mode() {
        let p = Policy::compile(Mode::Allowlist, &s(&["*.example.org"]), &s(&["secret.example.org"])).unwrap();
        assert!(allowed(&p, "a.example.org", 443));
        match p.check(&host("secret.example.org"), 443) {
            NameVerdict::Refused { rule, .. } => assert_eq!(rule, "deny \"secret.example.org\""),
            other => panic!("{other:?}"),
        }
        let open = Policy::compile(Mode::Open, &[], &s(&["*.evil.test", "1.2.3.4"])).unwrap();
        assert!(allowed(&open, "anything.example", 443));
        assert!(!allowed(&open, "x.evil.test", 443));
        assert!(!allowed(&open, "1.2.3.4", 443));
        assert!(!allowed(&open, "0x1020304", 443), "an odd IPv4 spelling matches the canonical pattern");
    }

    #[test]
    fn none_refuses_everything() {
        let p = Policy::compile(Mode::None, &[], &[]).unwrap();
        assert!(!allowed(&p, "example.com", 443));
        assert_eq!(p, Policy::none());
    }

    #[test]
    fn name_patterns_never_match_ip_literals() {
        let p = Policy::compile(Mode::Allowlist, &s(&["localhost", "*.1"]), &[]);
        assert!(p.is_err(), "*.1 ends in a number, it is no domain");
        let p = Policy::compile(Mode::Allowlist, &s(&["localhost", "127.0.0.1"]), &[]).unwrap();
        assert!(allowed(&p, "localhost", 80));
        assert!(allowed(&p, "127.1", 80), "IP pattern matches any spelling of its address");
        assert!(!allowed(&p, "[::1]", 80));
    }

    #[test]
    fn bad_patterns_are_named_with_a_fix() {
        let cases = [
            ("", "empty"),
            ("*", "mode open"),
            ("api.*.com", "first label"),
            ("*.", "empty host"),
            ("example.com:0", "bad port"),
            ("example.com:99999", "bad port"),
            ("example.com:https", "bad port"),
            ("10.0.0.0/8", "allow_cidrs"),
            ("bücher.de", "punycode"),
            ("a..b", "empty label"),
            ("999.1.1.1", "IPv4"),
            ("[::1", "unclosed"),
            ("*.10.0.0.1", "not an IP"),
        ];
        for (pattern, want) in cases {
            let err = Policy::compile(Mode::Allowlist, &s(&["ok.example", pattern]), &[]).unwrap_err();
            assert_eq!(err.pattern, pattern);
            let msg = err.to_string();
            assert!(msg.contains(want), "{pattern:?}: {msg}");
            assert!(msg.contains("allow pattern"), "{msg}");
        }
        let err = Policy::compile(Mode::Open, &[], &s(&["bad host"])).unwrap_err();
        assert_eq!(err.list, "deny");
    }

    #[test]
    fn allow_patterns_outside_allowlist_mode_are_an_error() {
        let err = Policy::compile(Mode::None, &s(&["a.example"]), &[]).unwrap_err();
        assert!(err.reason.contains("use mode allowlist"), "{err}");
        assert!(Policy::compile(Mode::Open, &s(&["a.example"]), &[]).is_err());
    }
}
