//! E2B's network options in sandkasten's terms: `allow_internet_access` and `network.{allowOut, denyOut}` become a
//! [`NetworkPolicy`] for the egress proxy.
//!
//! E2B: no options = internet; `allow_internet_access=False` = deny `0.0.0.0/0`; `allowOut` entries (IPs, CIDRs,
//! domains, `*.domain`) win over `denyOut` entries (IPs, CIDRs). Here: no options = no network (sandkasten's default;
//! said in docs/e2b-compat.md); all traffic denied with some allowed = `allowlist` of those; specific addresses denied
//! = `open` minus them; anything allowed without a deny-all = `open`. CIDRs other than a single address have no
//! sandkasten equivalent and are refused (501), never silently widened or dropped.
//!
//! `rules` (`{host: [{"transform": {"headers": {...}}}]}`) become the policy's header rules, with
//! `${e2b.secrets.NAME}` spelled `${secrets.NAME}`; rules on addresses, other transform fields and other
//! placeholders (`${e2b.identity…}`) are refused (501).

use std::collections::BTreeMap;

use sandkasten_types::{HeaderRule, NetworkMode, NetworkPolicy};
use serde::Deserialize;

use crate::e2b::error::E2bError;

/// The `network` object of a create, as the SDK sends it (unknown fields are ignored, as E2B does).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NetworkOptions {
    #[serde(default)]
    allow_out: Option<Vec<String>>,
    #[serde(default)]
    deny_out: Option<Vec<String>>,
    #[serde(default)]
    rules: Option<serde_json::Value>,
    #[serde(default)]
    mask_request_host: Option<String>,
    /// Inbound, not egress: whether `get_host` URLs are served without the traffic access token.
    #[serde(default)]
    allow_public_traffic: Option<bool>,
    /// Ports served as HTTPS inside: the port streams carry plain HTTP only.
    #[serde(default)]
    https_ports: Option<Vec<u16>>,
}

/// Whether `entry` means "all IPv4 traffic".
fn is_everything(entry: &str) -> bool {
    matches!(entry.trim(), "0.0.0.0/0" | "::/0")
}

/// One address entry as a host pattern: an IP or a single-address CIDR; wider CIDRs have no equivalent.
fn address_pattern(entry: &str) -> Result<String, E2bError> {
    let entry = entry.trim();
    let (address, prefix) = entry.split_once('/').unwrap_or((entry, ""));
    let single = match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => prefix.is_empty() || prefix == "32",
        Ok(std::net::IpAddr::V6(_)) => prefix.is_empty() || prefix == "128",
        Err(_) => false,
    };
    if single {
        return Ok(address.to_owned());
    }
    Err(E2bError::unsupported(&format!(
        "network rule {entry:?} (address ranges; sandkasten's egress policy names hosts and single addresses, and \
         already refuses private, link-local and loopback ranges)"
    )))
}

/// The policy for a create's `allow_internet_access` and `network`.
pub(crate) fn policy(internet: Option<bool>, network: Option<&serde_json::Value>) -> Result<NetworkPolicy, E2bError> {
    let options: NetworkOptions = match network {
        Some(value) => {
            serde_json::from_value(value.clone()).map_err(|error| E2bError::invalid(format!("network: {error}")))?
        }
        None => NetworkOptions::default(),
    };
    let headers = match &options.rules {
        Some(rules) => header_rules(rules)?,
        None => Vec::new(),
    };
    if options.https_ports.as_ref().is_some_and(|ports| !ports.is_empty()) {
        return Err(E2bError::unsupported("network.httpsPorts (ports are reached over plain HTTP)"));
    }
    if options.mask_request_host.is_some() {
        return Err(E2bError::unsupported("network.maskRequestHost"));
    }
    // `allowPublicTraffic` alone asks nothing of egress.
    let nothing_asked = internet.is_none() && options.allow_out.is_none() && options.deny_out.is_none();
    let allow = options.allow_out.unwrap_or_default();
    let deny = options.deny_out.unwrap_or_default();
    let deny_all = internet == Some(false) || deny.iter().any(|entry| is_everything(entry));
    let allow_all = allow.iter().any(|entry| is_everything(entry));
    let public =
        NetworkPolicy { allow_public_traffic: options.allow_public_traffic == Some(true), ..Default::default() };
    let public = NetworkPolicy { headers, ..public };
    if nothing_asked || (deny_all && allow.is_empty()) {
        return Ok(public);
    }
    if deny_all && !allow_all {
        let allow = allow
            .iter()
            .map(|entry| if entry.contains('/') { address_pattern(entry) } else { Ok(entry.trim().to_owned()) })
            .collect::<Result<_, _>>()?;
        return Ok(NetworkPolicy { mode: NetworkMode::Allowlist, allow, ..public });
    }
    // Everything allowed, except the listed addresses (allowed entries win over denied ones, as in E2B).
    let deny = deny
        .iter()
        .filter(|entry| !allow.iter().any(|allowed| allowed.trim() == entry.trim()))
        .map(|entry| address_pattern(entry))
        .collect::<Result<_, _>>()?;
    Ok(NetworkPolicy { mode: NetworkMode::Open, deny, ..public })
}

/// E2B's placeholder of a secret, and sandkasten's.
const E2B_SECRET: &str = "${e2b.secrets.";
const SECRET: &str = "${secrets.";

/// One rule of E2B's `rules` map, as the SDK sends it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct E2bRule {
    #[serde(default)]
    transform: Option<E2bTransform>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct E2bTransform {
    #[serde(default)]
    headers: Option<BTreeMap<String, String>>,
}

/// E2B's `rules` as header rules; 501 for what has no equivalent, 400 for what is malformed.
fn header_rules(rules: &serde_json::Value) -> Result<Vec<HeaderRule>, E2bError> {
    let rules: BTreeMap<String, Vec<serde_json::Value>> = serde_json::from_value(rules.clone())
        .map_err(|error| E2bError::invalid(format!("network.rules: {error} (a map of host to a list of rules)")))?;
    let mut out = Vec::new();
    for (host, list) in rules {
        let bare = host.split('/').next().unwrap_or(&host);
        if bare.parse::<std::net::IpAddr>().is_ok() || host.contains('/') {
            return Err(E2bError::unsupported(&format!(
                "network.rules on {host:?} (rules on addresses and CIDRs; name the host)"
            )));
        }
        for rule in list {
            let rule: E2bRule = serde_json::from_value(rule).map_err(|error| {
                E2bError::unsupported(&format!(
                    "network.rules[{host:?}]: {error} (only transform.headers is supported)"
                ))
            })?;
            let headers = rule.transform.and_then(|t| t.headers).unwrap_or_default();
            for (name, value) in headers {
                out.push(HeaderRule { host: host.clone(), name, value: to_native(&value)? });
            }
        }
    }
    Ok(out)
}

/// `${e2b.secrets.NAME}` as `${secrets.NAME}`; any other `${…}` placeholder is refused.
fn to_native(value: &str) -> Result<String, E2bError> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start..];
        let Some(inner) = after.strip_prefix(E2B_SECRET) else {
            let shown: String = after.chars().take(40).collect();
            return Err(E2bError::unsupported(&format!(
                "the placeholder {shown:?} in a network rule (only ${{e2b.secrets.NAME}} is resolved here)"
            )));
        };
        out.push_str(SECRET);
        let end = inner.find('}').map_or(inner.len(), |i| i + 1);
        out.push_str(&inner[..end]);
        rest = &inner[end..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The header rules in E2B's `rules` shape, placeholders spelled as E2B does (never a value: the policy holds none).
pub(crate) fn rules_info(headers: &[HeaderRule]) -> Option<serde_json::Value> {
    if headers.is_empty() {
        return None;
    }
    let mut by_host: BTreeMap<&str, serde_json::Map<String, serde_json::Value>> = BTreeMap::new();
    for rule in headers {
        by_host.entry(&rule.host).or_default().insert(rule.name.clone(), rule.value.replace(SECRET, E2B_SECRET).into());
    }
    let map = by_host
        .into_iter()
        .map(|(host, headers)| (host.to_owned(), serde_json::json!([{"transform": {"headers": headers}}])))
        .collect::<serde_json::Map<_, _>>();
    Some(serde_json::Value::Object(map))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn mode(internet: Option<bool>, network: Option<serde_json::Value>) -> NetworkPolicy {
        policy(internet, network.as_ref()).unwrap()
    }

    #[test]
    fn without_options_there_is_no_network_and_internet_access_is_open() {
        assert_eq!(mode(None, None), NetworkPolicy::none());
        assert_eq!(mode(Some(false), None), NetworkPolicy::none());
        assert_eq!(mode(Some(true), None).mode, NetworkMode::Open);
    }

    #[test]
    fn deny_all_with_allowed_names_is_an_allowlist() {
        let network =
            json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["api.example.com", "*.example.org", "203.0.113.7/32"]});
        let policy = mode(None, Some(network));
        assert_eq!(policy.mode, NetworkMode::Allowlist);
        assert_eq!(policy.allow, ["api.example.com", "*.example.org", "203.0.113.7"]);
        let closed = mode(Some(false), Some(json!({"allowOut": ["api.example.com"]})));
        assert_eq!((closed.mode, closed.allow.len()), (NetworkMode::Allowlist, 1));
    }

    #[test]
    fn denied_addresses_are_subtracted_from_open_and_allowed_ones_win() {
        let policy =
            mode(None, Some(json!({"denyOut": ["198.51.100.1", "198.51.100.2"], "allowOut": ["198.51.100.2"]})));
        assert_eq!((policy.mode, policy.deny), (NetworkMode::Open, vec!["198.51.100.1".to_owned()]));
    }

    #[test]
    fn public_traffic_is_inbound_and_asks_nothing_of_egress() {
        let public = mode(None, Some(json!({"allowPublicTraffic": true})));
        assert_eq!(public, NetworkPolicy { allow_public_traffic: true, ..NetworkPolicy::none() });
        let closed = mode(Some(true), Some(json!({"allowPublicTraffic": false})));
        assert_eq!((closed.mode, closed.allow_public_traffic), (NetworkMode::Open, false));
        let listed =
            mode(None, Some(json!({"allowPublicTraffic": true, "denyOut": ["0.0.0.0/0"], "allowOut": ["a.example"]})));
        assert_eq!((listed.mode, listed.allow_public_traffic), (NetworkMode::Allowlist, true));
    }

    #[test]
    fn what_has_no_equivalent_is_refused_not_widened() {
        for network in [
            json!({"denyOut": ["10.0.0.0/8"]}),
            json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["203.0.113.0/24"]}),
            json!({"rules": {"203.0.113.0/24": []}}),
            json!({"rules": {"203.0.113.7": []}}),
            json!({"rules": {"a.example": [{"transform": {"body": "x"}}]}}),
            json!({"rules": {"a.example": [{"transform": {"headers": {"X": "${e2b.identity.aws}"}}}]}}),
            json!({"maskRequestHost": "x"}),
            json!({"httpsPorts": [8443]}),
        ] {
            assert!(policy(None, Some(&network)).is_err(), "{network}");
        }
        assert!(policy(None, Some(&json!({"allowOut": "not a list"}))).is_err());
    }

    #[test]
    fn header_transforms_become_header_rules_and_read_back() {
        let rules =
            json!({"api.example.com": [{"transform": {"headers": {"Authorization": "Bearer ${e2b.secrets.tok}"}}}]});
        let asked =
            mode(None, Some(json!({"allowOut": ["api.example.com"], "denyOut": ["0.0.0.0/0"], "rules": rules})));
        assert_eq!(
            asked.headers,
            [HeaderRule {
                host: "api.example.com".into(),
                name: "Authorization".into(),
                value: "Bearer ${secrets.tok}".into()
            }]
        );
        assert_eq!(rules_info(&asked.headers), Some(rules));
        assert_eq!(rules_info(&[]), None);
    }
}
