//! Secrets the sandbox only knows by placeholder: the proxy swaps the placeholder for the real value in request
//! header values, and only on requests to the secret's hosts. Bodies, URLs and other hosts are left alone, so
//! a placeholder sent anywhere else goes out unchanged and the real value never leaves toward it.
//!
//! **Over TLS only, unless a port says otherwise.** A host pattern without a port (`api.example.com`) or with `:443`
//! lets the value travel only inside intercepted TLS, whatever the port: never in plain HTTP, where anyone on the
//! path reads it. A pattern naming another port (`api.example.com:80`, `host:8080`) also lets it travel in plain HTTP
//! to that port, since the operator named a plain port on purpose.
//!
//! **Header rules** are secrets too: a [`Secret`] with a `header` has no placeholder; the proxy sets that header to
//! the value on requests to the secret's hosts (added, or replacing what the sandbox sent), under the same rules.
//! The server builds them from a policy's header rules (`${secrets.NAME}` resolved in the value), so the value never
//! enters the sandbox either.

use std::fmt;

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

use crate::host::Host;
use crate::policy::{Pattern, PolicyError};

/// Shortest placeholder accepted, so an accidental short string in a header is never replaced.
const MIN_PLACEHOLDER_LEN: usize = 8;

/// A tenant secret as given to a sandbox.
#[derive(Clone)]
pub struct Secret {
    /// The secret's name (for messages).
    pub name: String,
    /// The real value; never enters the sandbox.
    pub value: String,
    /// What the sandbox sees instead, e.g. in its environment (unused, and may be empty, with `header`).
    pub placeholder: String,
    /// Host patterns (policy syntax) of the destinations the real value may be sent to: over TLS, and over plain
    /// HTTP only to a port a pattern names (other than 443).
    pub hosts: Vec<String>,
    /// A header rule: the proxy sets this header to `value` on requests to `hosts` instead of swapping a placeholder.
    pub header: Option<String>,
}

/// The port of TLS: naming it never lets a value travel in plain HTTP.
const TLS_PORT: u16 = 443;

/// How a request reaches its host, which decides the secrets it may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// Inside an intercepted TLS tunnel: every secret with a pattern matching the host and port.
    Tls,
    /// Plain HTTP forwarding: only secrets with a pattern that names this port, and it is not 443.
    Plain,
}

impl Transport {
    /// The port a URL of this transport means when it names none.
    pub(crate) fn default_port(self) -> u16 {
        match self {
            Transport::Tls => TLS_PORT,
            Transport::Plain => 80,
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("value", &"<redacted>")
            .field("placeholder", &self.placeholder)
            .field("hosts", &self.hosts)
            .field("header", &self.header)
            .finish()
    }
}

/// Why a secret cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// A host pattern is invalid.
    #[error("secret {name:?}: {source}")]
    Pattern {
        /// The secret.
        name: String,
        /// The pattern error.
        source: PolicyError,
    },
    /// The placeholder or value is unusable.
    #[error("secret {name:?}: {reason}")]
    Invalid {
        /// The secret.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

/// Checks a secret's host patterns: each must parse, and none may be a wildcard over a top-level domain
/// (`*.com` would send the value to every `.com` host, one the sandbox's author registers included).
pub fn check_secret_hosts(hosts: &[String]) -> Result<(), PolicyError> {
    parse_hosts(hosts).map(drop)
}

fn parse_hosts(hosts: &[String]) -> Result<Vec<Pattern>, PolicyError> {
    hosts
        .iter()
        .map(|h| {
            let pattern = Pattern::parse("secret hosts", h)?;
            if pattern.wildcard_labels().is_some_and(|labels| labels < 2) {
                return Err(PolicyError {
                    list: "secret hosts",
                    pattern: h.clone(),
                    reason: "a wildcard over a top-level domain matches hosts anyone can register: name the \
                             domain, as in *.example.com"
                        .into(),
                });
            }
            Ok(pattern)
        })
        .collect()
}

/// A secret with compiled host patterns.
#[derive(Clone)]
pub(crate) struct CompiledSecret {
    value: HeaderValue,
    /// A header rule's header (then `placeholder` is empty and never matches).
    header: Option<HeaderName>,
    placeholder: Vec<u8>,
    hosts: Vec<Pattern>,
}

impl fmt::Debug for CompiledSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CompiledSecret(<redacted>)")
    }
}

impl CompiledSecret {
    pub(crate) fn compile(secret: &Secret) -> Result<CompiledSecret, SecretError> {
        let invalid = |reason: &str| SecretError::Invalid { name: secret.name.clone(), reason: reason.to_owned() };
        let header = match &secret.header {
            Some(name) => Some(
                HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| invalid("the header name must be an HTTP token, such as Authorization"))?,
            ),
            None => None,
        };
        if header.is_none() && secret.placeholder.len() < MIN_PLACEHOLDER_LEN {
            return Err(invalid("placeholder must be at least 8 characters"));
        }
        if header.is_none() && secret.value.contains(&secret.placeholder) {
            return Err(invalid("the value must not contain its placeholder"));
        }
        if header.as_ref().is_some_and(|name| name == http::header::HOST) {
            return Err(invalid("the Host header is the proxy's (it names the checked destination)"));
        }
        let placeholder = if header.is_some() { Vec::new() } else { secret.placeholder.as_bytes().to_vec() };
        let value = HeaderValue::from_str(&secret.value)
            .map_err(|_| invalid("value must be visible ASCII fit for an HTTP header (no CR, LF or control bytes)"))?;
        if secret.hosts.is_empty() {
            return Err(invalid("no hosts: list the host patterns the secret may be sent to"));
        }
        let hosts =
            parse_hosts(&secret.hosts).map_err(|source| SecretError::Pattern { name: secret.name.clone(), source })?;
        Ok(CompiledSecret { value, header, placeholder, hosts })
    }

    pub(crate) fn applies_to(&self, host: &Host, port: u16, transport: Transport) -> bool {
        self.hosts.iter().any(|p| {
            p.matches(host, port) && (transport == Transport::Tls || p.port().is_some_and(|named| named != TLS_PORT))
        })
    }
}

/// Whether any secret may be sent to this destination over TLS (decides TLS interception).
pub(crate) fn any_for(secrets: &[CompiledSecret], host: &Host, port: u16) -> bool {
    secrets.iter().any(|s| s.applies_to(host, port, Transport::Tls))
}

/// The head would grow past its limit if every placeholder became its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeadTooLarge;

/// Replaces placeholders in header values with the real values of the secrets that apply to `host:port` over
/// `transport`.
/// Then header rules that apply set their header (replacing what the sandbox sent).
/// Returns how many header values changed. A value is much longer than its placeholder, so a head full of
/// placeholders would grow many times over: if the head (names, values and line overhead) would exceed
/// `max_head` bytes, nothing is built and the head is left as it was.
pub(crate) fn substitute(
    secrets: &[CompiledSecret],
    host: &Host,
    port: u16,
    transport: Transport,
    headers: &mut HeaderMap,
    max_head: usize,
) -> Result<usize, HeadTooLarge> {
    let applicable: Vec<&CompiledSecret> = secrets.iter().filter(|s| s.applies_to(host, port, transport)).collect();
    if applicable.is_empty() {
        return Ok(0);
    }
    let mut head: usize = headers.iter().map(|(name, value)| name.as_str().len() + value.len() + 4).sum();
    for (name, value) in applicable.iter().filter_map(|s| s.header.as_ref().map(|name| (name, &s.value))) {
        head = head.saturating_add(name.as_str().len() + value.len() + 4);
    }
    for value in headers.values() {
        for secret in &applicable {
            let count = count(value.as_bytes(), &secret.placeholder);
            let growth = secret.value.len().saturating_sub(secret.placeholder.len()).saturating_mul(count);
            head = head.saturating_add(growth);
        }
    }
    if head > max_head {
        return Err(HeadTooLarge);
    }
    let mut changed = 0;
    for value in headers.values_mut() {
        let mut bytes = value.as_bytes().to_vec();
        let mut touched = false;
        for secret in &applicable {
            if let Some(replaced) = replace_all(&bytes, &secret.placeholder, secret.value.as_bytes()) {
                bytes = replaced;
                touched = true;
            }
        }
        if touched && let Ok(new) = HeaderValue::from_bytes(&bytes) {
            *value = new;
            changed += 1;
        }
    }
    for secret in &applicable {
        if let Some(name) = &secret.header {
            headers.insert(name.clone(), secret.value.clone());
            changed += 1;
        }
    }
    Ok(changed)
}

/// Non-overlapping occurrences of `needle` in `haystack`.
fn count(haystack: &[u8], needle: &[u8]) -> usize {
    let mut n = 0;
    let mut rest = haystack;
    while let Some(i) = find(rest, needle) {
        n += 1;
        rest = &rest[i + needle.len()..];
    }
    n
}

fn replace_all(haystack: &[u8], needle: &[u8], with: &[u8]) -> Option<Vec<u8>> {
    let first = find(haystack, needle)?;
    let mut out = Vec::with_capacity(haystack.len() + with.len());
    out.extend_from_slice(&haystack[..first]);
    out.extend_from_slice(with);
    let mut rest = &haystack[first + needle.len()..];
    while let Some(i) = find(rest, needle) {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(with);
        rest = &rest[i + needle.len()..];
    }
    out.extend_from_slice(rest);
    Some(out)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || needle.len() > haystack.len() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::host::canonicalize_host;

    fn secret(hosts: &[&str]) -> Secret {
        Secret {
            name: "gh".into(),
            value: "real-token-123".into(),
            placeholder: "SANDKASTEN_PLACEHOLDER_gh".into(),
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            header: None,
        }
    }

    fn rule(hosts: &[&str]) -> Secret {
        Secret {
            name: "rule".into(),
            value: "Bearer real-token-123".into(),
            placeholder: String::new(),
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            header: Some("Authorization".into()),
        }
    }

    #[test]
    fn a_header_rule_sets_its_header_toward_its_hosts_over_tls_only() {
        let compiled = vec![CompiledSecret::compile(&rule(&["api.example.com"])).unwrap()];
        let host = |h: &str| canonicalize_host(h).unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("authorization", "Bearer sandbox-chose-this".parse().unwrap());
        headers.insert("x-other", "kept".parse().unwrap());
        let mut plain = headers.clone();
        let mut elsewhere = headers.clone();
        assert_eq!(substitute(&compiled, &host("api.example.com"), 443, Transport::Tls, &mut headers, 1 << 16), Ok(1));
        assert_eq!(headers["authorization"], "Bearer real-token-123", "an existing header is overridden");
        assert_eq!(headers.get_all("authorization").iter().count(), 1);
        assert_eq!(headers["x-other"], "kept");
        let mut fresh = HeaderMap::new();
        assert_eq!(substitute(&compiled, &host("api.example.com"), 443, Transport::Tls, &mut fresh, 1 << 16), Ok(1));
        assert_eq!(fresh["authorization"], "Bearer real-token-123", "a missing header is added");
        assert_eq!(substitute(&compiled, &host("api.example.com"), 80, Transport::Plain, &mut plain, 1 << 16), Ok(0));
        assert_eq!(plain["authorization"], "Bearer sandbox-chose-this", "never in plain HTTP to an unnamed port");
        for other in ["evil.test", "api.example.com.evil.test", "x.api.example.com"] {
            assert_eq!(substitute(&compiled, &host(other), 443, Transport::Tls, &mut elsewhere, 1 << 16), Ok(0));
        }
        assert_eq!(elsewhere["authorization"], "Bearer sandbox-chose-this", "never toward another host");
        assert!(any_for(&compiled, &host("api.example.com"), 443), "the rule's host is intercepted");
        assert!(!any_for(&compiled, &host("evil.test"), 443));
        let named = vec![CompiledSecret::compile(&rule(&["plain.test:8080"])).unwrap()];
        let mut headers = HeaderMap::new();
        assert_eq!(substitute(&named, &host("plain.test"), 8080, Transport::Plain, &mut headers, 1 << 16), Ok(1));
        assert!(!format!("{named:?}{:?}", rule(&[])).contains("real-token"), "Debug redacts");
    }

    #[test]
    fn a_header_rule_needs_a_header_name_and_not_host_and_counts_toward_the_head() {
        let mut bad = rule(&["api.example.com"]);
        bad.header = Some("Bad Header".into());
        assert!(CompiledSecret::compile(&bad).unwrap_err().to_string().contains("HTTP token"));
        bad.header = Some("host".into());
        assert!(CompiledSecret::compile(&bad).unwrap_err().to_string().contains("Host"));
        let compiled = vec![CompiledSecret::compile(&rule(&["api.example.com"])).unwrap()];
        let host = canonicalize_host("api.example.com").unwrap();
        let mut headers = HeaderMap::new();
        assert_eq!(substitute(&compiled, &host, 443, Transport::Tls, &mut headers, 10), Err(HeadTooLarge));
        assert!(headers.is_empty());
    }

    #[test]
    fn placeholder_is_replaced_only_toward_matching_hosts() {
        let compiled = vec![CompiledSecret::compile(&secret(&["api.example.com:443"])).unwrap()];
        let mut headers = HeaderMap::new();
        headers.insert("authorization", "Bearer SANDKASTEN_PLACEHOLDER_gh".parse().unwrap());
        headers.insert("x-twice", "SANDKASTEN_PLACEHOLDER_gh,SANDKASTEN_PLACEHOLDER_gh".parse().unwrap());
        let mut other = headers.clone();
        let host = canonicalize_host("API.example.com").unwrap();
        assert_eq!(substitute(&compiled, &host, 443, Transport::Tls, &mut headers, 64 * 1024), Ok(2));
        assert_eq!(headers["authorization"], "Bearer real-token-123");
        assert_eq!(headers["x-twice"], "real-token-123,real-token-123");
        assert_eq!(substitute(&compiled, &host, 80, Transport::Tls, &mut other, 64 * 1024), Ok(0), "wrong port");
        let evil = canonicalize_host("api.example.com.evil.test").unwrap();
        assert_eq!(substitute(&compiled, &evil, 443, Transport::Tls, &mut other, 64 * 1024), Ok(0));
        assert_eq!(other["authorization"], "Bearer SANDKASTEN_PLACEHOLDER_gh");
    }

    #[test]
    fn plain_http_carries_a_secret_only_to_a_port_its_pattern_names() {
        let compiled =
            CompiledSecret::compile(&secret(&["api.example.com", "*.example.org:443", "plain.test:8080"])).unwrap();
        let host = |h: &str| canonicalize_host(h).unwrap();
        // No port, or 443: TLS only, on any port (no port) or 443.
        assert!(compiled.applies_to(&host("api.example.com"), 443, Transport::Tls));
        assert!(compiled.applies_to(&host("api.example.com"), 8443, Transport::Tls));
        assert!(!compiled.applies_to(&host("api.example.com"), 80, Transport::Plain));
        assert!(!compiled.applies_to(&host("api.example.com"), 443, Transport::Plain));
        assert!(compiled.applies_to(&host("x.example.org"), 443, Transport::Tls));
        assert!(!compiled.applies_to(&host("x.example.org"), 443, Transport::Plain), "443 is TLS's port");
        // A named plain port: plain HTTP to that port, and TLS there too; no other port.
        assert!(compiled.applies_to(&host("plain.test"), 8080, Transport::Plain));
        assert!(compiled.applies_to(&host("plain.test"), 8080, Transport::Tls));
        assert!(!compiled.applies_to(&host("plain.test"), 80, Transport::Plain));
        let mut headers = HeaderMap::new();
        headers.insert("authorization", "Bearer SANDKASTEN_PLACEHOLDER_gh".parse().unwrap());
        let secrets = [compiled];
        assert_eq!(substitute(&secrets, &host("api.example.com"), 80, Transport::Plain, &mut headers, 1 << 16), Ok(0));
        assert_eq!(headers["authorization"], "Bearer SANDKASTEN_PLACEHOLDER_gh");
        assert_eq!(substitute(&secrets, &host("plain.test"), 8080, Transport::Plain, &mut headers, 1 << 16), Ok(1));
        assert_eq!(headers["authorization"], "Bearer real-token-123");
    }

    #[test]
    fn a_head_that_would_outgrow_the_limit_is_left_alone() {
        let mut long = secret(&["api.example.com"]);
        long.value = "v".repeat(1000);
        let compiled = vec![CompiledSecret::compile(&long).unwrap()];
        let host = canonicalize_host("api.example.com").unwrap();
        let mut headers = HeaderMap::new();
        let many = ["SANDKASTEN_PLACEHOLDER_gh"; 10].join(",");
        headers.insert("x-many", many.parse().unwrap());
        assert_eq!(substitute(&compiled, &host, 443, Transport::Tls, &mut headers, 9_000), Err(HeadTooLarge));
        assert_eq!(headers["x-many"], many.as_str(), "nothing was replaced");
        assert_eq!(substitute(&compiled, &host, 443, Transport::Tls, &mut headers, 11_000), Ok(1));
        assert_eq!(headers["x-many"].len(), 10 * 1000 + 9);
    }

    #[test]
    fn a_wildcard_over_a_top_level_domain_is_no_secret_host() {
        let err = CompiledSecret::compile(&secret(&["api.example.com", "*.com"])).unwrap_err().to_string();
        assert!(err.contains("*.com") && err.contains("top-level"), "{err}");
        assert!(check_secret_hosts(&["*.io:443".to_owned()]).is_err());
        assert!(check_secret_hosts(&["*.example.com".to_owned(), "com".to_owned()]).is_ok());
    }

    #[test]
    fn unusable_secrets_are_rejected_and_debug_redacts() {
        let mut s = secret(&["bad host"]);
        assert!(CompiledSecret::compile(&s).unwrap_err().to_string().contains("bad host"));
        s.hosts = vec!["ok.example".into()];
        s.value = "a\r\nX-Injected: 1".into();
        assert!(CompiledSecret::compile(&s).is_err());
        s.value = "v".into();
        s.placeholder = "short".into();
        assert!(CompiledSecret::compile(&s).is_err());
        s.hosts.clear();
        s.placeholder = "SANDKASTEN_PLACEHOLDER_x".into();
        assert!(CompiledSecret::compile(&s).is_err());
        assert!(!format!("{:?}", secret(&[])).contains("real-token"));
    }
}
