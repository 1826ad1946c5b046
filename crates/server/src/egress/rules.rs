//! A policy's header rules as the proxy takes them: each `${secrets.NAME}` in a value resolved to the tenant
//! secret's value (on the host, when the policy is given to the proxy), each rule a header-rule [`Secret`].
//!
//! A secret with hosts of its own (made with `PUT /v1/secrets/{name}`) goes only to a rule host it lists exactly; a
//! secret without hosts (made through the E2B facade) goes only where a rule puts it.

use std::collections::BTreeMap;

use sandkasten_egress::{Policy, Secret, canonicalize_host, check_secret_hosts};
use sandkasten_types::HeaderRule;

/// Most header rules per sandbox.
pub const MAX_RULES: usize = 64;
/// The placeholder syntax of a secret's value in a rule.
const OPEN: &str = "${secrets.";

/// What a rule's secret reference resolves to: the secret's value and its own host patterns (empty: any rule host).
#[derive(Clone)]
pub struct RuleSecret {
    /// The real value.
    pub value: String,
    /// The secret's host patterns (empty for an E2B secret).
    pub hosts: Vec<String>,
}

impl std::fmt::Debug for RuleSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuleSecret").field("hosts", &self.hosts).finish_non_exhaustive()
    }
}

/// Why a rule cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// The rule itself is malformed (400).
    #[error("network.headers: {0}")]
    Invalid(String),
    /// A rule names a secret the tenant does not have (400).
    #[error("network.headers: secret {0:?} does not exist for this tenant: create it first")]
    UnknownSecret(String),
}

/// The secret names a rule value refers to, in order; an error for a `${` that is no `${secrets.NAME}`.
pub fn referenced(value: &str) -> Result<Vec<String>, RuleError> {
    let mut names = Vec::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        let after = &rest[start..];
        let Some(inner) = after.strip_prefix(OPEN) else {
            return Err(RuleError::Invalid(format!(
                "{value:?}: only ${{secrets.NAME}} placeholders are understood in a header value"
            )));
        };
        let Some(end) = inner.find('}') else {
            return Err(RuleError::Invalid(format!("{value:?}: a ${{secrets.NAME}} placeholder is not closed")));
        };
        let name = &inner[..end];
        if name.is_empty() {
            return Err(RuleError::Invalid(format!("{value:?}: ${{secrets.}} names no secret")));
        }
        names.push(name.to_owned());
        rest = &inner[end + 1..];
    }
    Ok(names)
}

/// Checks rules against the policy that carries them, before any secret is read: a bounded count, valid host
/// patterns and header names, placeholders understood, and each host allowed by `policy` (a rule toward a host the
/// sandbox cannot reach is a mistake).
pub fn check(rules: &[HeaderRule], policy: &Policy) -> Result<(), RuleError> {
    if rules.len() > MAX_RULES {
        return Err(RuleError::Invalid(format!("at most {MAX_RULES} header rules per sandbox")));
    }
    for rule in rules {
        check_secret_hosts(std::slice::from_ref(&rule.host)).map_err(|e| RuleError::Invalid(e.to_string()))?;
        if axum::http::HeaderName::from_bytes(rule.name.as_bytes()).is_err() || rule.name.eq_ignore_ascii_case("host") {
            return Err(RuleError::Invalid(format!(
                "{:?} is no header the proxy may set: use an HTTP token such as Authorization (not Host)",
                rule.name
            )));
        }
        if rule.value.chars().any(char::is_control) {
            return Err(RuleError::Invalid(format!("the value of header {:?} has a control character", rule.name)));
        }
        referenced(&rule.value)?;
        let (name, port) = split_port(&rule.host);
        // A wildcard stands for any of its subdomains: one of them must be reachable.
        let probe = match name.strip_prefix("*.") {
            Some(domain) => format!("sandkasten-rule-check.{domain}"),
            None => name.to_owned(),
        };
        let allowed = match canonicalize_host(&probe) {
            Ok(host) => policy.permits_name(&host, port.unwrap_or(443)),
            Err(_) => false,
        };
        if !allowed {
            return Err(RuleError::Invalid(format!(
                "host {:?} has a header rule but the policy does not let the sandbox reach it: allow it too",
                rule.host
            )));
        }
    }
    Ok(())
}

fn split_port(host: &str) -> (&str, Option<u16>) {
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') => (name, port.parse().ok()),
        _ => (host, None),
    }
}

/// The rules as header-rule secrets. `strict`: a rule whose secret is missing, or whose secret may not go to the
/// rule's host, is an error (a new policy); otherwise it is dropped (a secret deleted, or its hosts narrowed, under a
/// running sandbox: its header is no longer set, and the other rules stay in force).
pub fn resolve(
    rules: &[HeaderRule],
    secrets: &BTreeMap<String, RuleSecret>,
    strict: bool,
) -> Result<Vec<Secret>, RuleError> {
    let mut resolved = Vec::new();
    'rules: for rule in rules {
        let mut value = rule.value.clone();
        for name in referenced(&rule.value)? {
            let Some(secret) = secrets.get(&name) else {
                if strict {
                    return Err(RuleError::UnknownSecret(name));
                }
                continue 'rules;
            };
            if !secret.hosts.is_empty() && !secret.hosts.iter().any(|h| h == &rule.host) {
                if !strict {
                    continue 'rules;
                }
                return Err(RuleError::Invalid(format!(
                    "secret {name:?} may only be sent to its hosts {:?}; {:?} is not one of them",
                    secret.hosts, rule.host
                )));
            }
            value = value.replace(&format!("{OPEN}{name}}}"), &secret.value);
        }
        resolved.push(Secret {
            name: format!("header rule {} {}", rule.host, rule.name),
            value,
            placeholder: String::new(),
            hosts: vec![rule.host.clone()],
            header: Some(rule.name.clone()),
        });
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use sandkasten_egress::Mode;

    use super::*;

    fn rule(host: &str, value: &str) -> HeaderRule {
        HeaderRule { host: host.into(), name: "Authorization".into(), value: value.into() }
    }

    #[test]
    fn placeholders_are_found_and_resolved() {
        assert_eq!(referenced("Bearer ${secrets.A} ${secrets.b-c}").unwrap(), ["A", "b-c"]);
        assert!(referenced("${e2b.identity.x}").is_err());
        assert!(referenced("${secrets.A").is_err());
        let secrets = BTreeMap::from([("A".to_owned(), RuleSecret { value: "real".into(), hosts: Vec::new() })]);
        let out = resolve(&[rule("api.example.com", "Bearer ${secrets.A}")], &secrets, true).unwrap();
        assert_eq!((out[0].value.as_str(), out[0].header.as_deref()), ("Bearer real", Some("Authorization")));
        let missing = [rule("api.example.com", "${secrets.B}")];
        assert_eq!(resolve(&missing, &secrets, true).unwrap_err(), RuleError::UnknownSecret("B".into()));
        assert!(resolve(&missing, &secrets, false).unwrap().is_empty(), "dropped when not strict");
    }

    #[test]
    fn a_secret_with_hosts_goes_only_to_them_and_rules_need_an_allowed_host() {
        let secrets = BTreeMap::from([(
            "A".to_owned(),
            RuleSecret { value: "real".into(), hosts: vec!["api.example.com".into()] },
        )]);
        assert!(resolve(&[rule("api.example.com", "${secrets.A}")], &secrets, true).is_ok());
        assert!(resolve(&[rule("evil.test", "${secrets.A}")], &secrets, true).is_err());
        // Narrowed under a running sandbox: that rule is dropped, the others stay in force.
        let both = [rule("evil.test", "${secrets.A}"), rule("api.example.com", "Bearer ${secrets.A}")];
        let kept = resolve(&both, &secrets, false).unwrap();
        assert_eq!(kept.len(), 1, "only the rule toward the secret's host is kept");
        assert_eq!(
            (kept[0].hosts.clone(), kept[0].value.as_str()),
            (vec!["api.example.com".to_owned()], "Bearer real")
        );
        let policy = Policy::compile(Mode::Allowlist, &["api.example.com".into()], &[]).unwrap();
        assert!(check(&[rule("api.example.com", "x")], &policy).is_ok());
        assert!(check(&[rule("other.example.com", "x")], &policy).is_err());
        assert!(check(&[rule("*.com", "x")], &policy).is_err(), "a wildcard over a TLD");
        let bad_name = HeaderRule { name: "Host".into(), ..rule("api.example.com", "x") };
        assert!(check(&[bad_name], &policy).is_err());
    }
}
