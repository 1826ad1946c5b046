//! E2B's network options in sandkasten's terms: `allow_internet_access` and `network.{allowOut, denyOut}` become a
//! [`NetworkPolicy`] for the egress proxy.
//!
//! E2B: no options = internet; `allow_internet_access=False` = deny `0.0.0.0/0`; `allowOut` entries (IPs, CIDRs,
//! domains, `*.domain`) win over `denyOut` entries (IPs, CIDRs). Here: no options = no network (sandkasten's default;
//! said in docs/e2b-compat.md); all traffic denied with some allowed = `allowlist` of those; specific addresses denied
//! = `open` minus them; anything allowed without a deny-all = `open`. CIDRs other than a single address and
//! transform rules have no sandkasten equivalent and are refused (501), never silently widened or dropped.

use sandkasten_types::{NetworkMode, NetworkPolicy};
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
    if options.rules.is_some() {
        return Err(E2bError::unsupported("network.rules (request transforms; use sandkasten secrets)"));
    }
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
            json!({"rules": {"api.example.com": []}}),
            json!({"maskRequestHost": "x"}),
            json!({"httpsPorts": [8443]}),
        ] {
            assert!(policy(None, Some(&network)).is_err(), "{network}");
        }
        assert!(policy(None, Some(&json!({"allowOut": "not a list"}))).is_err());
    }
}
