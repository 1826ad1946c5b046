//! The E2B facade's settings (`[e2b]`): the wildcard domain under which a sandbox's ports are reached by host name,
//! `PORT-SANDBOXID.DOMAIN` (what the SDK's `get_host(port)` builds).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::problem::Found;

/// `[e2b]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct E2bConfig {
    /// The domain whose `PORT-SANDBOXID.` subdomains reach sandbox ports (point a wildcard DNS record
    /// `*.DOMAIN` at this server), reported to the SDK as the sandbox's `domain`. Default none: the facade reports no
    /// domain (the SDK then uses `E2B_DOMAIN`, default `e2b.app`) and any domain after `PORT-SANDBOXID.` is
    /// accepted.
    pub domain: Option<String>,
}

impl E2bConfig {
    /// Records what is wrong with these values.
    pub(crate) fn check(&self, found: &mut Found) {
        let Some(domain) = &self.domain else { return };
        let label_ok = |label: &str| {
            (1..=63).contains(&label.len())
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        };
        if domain.len() > 200 || !domain.split('.').all(label_ok) {
            found.add(
                "e2b.domain",
                format!("{domain:?} is not a domain name (lowercase letters, digits, '-' and '.', like sandboxes.example.com)"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_domain_must_be_a_lowercase_host_name() {
        for (domain, ok) in [
            ("sandboxes.example.com", true),
            ("localhost", true),
            ("Bad.Example", false),
            ("a..b", false),
            ("-a.b", false),
            ("", false),
        ] {
            let mut found = Found::default();
            E2bConfig { domain: Some(domain.into()) }.check(&mut found);
            assert_eq!(found.0.is_empty(), ok, "{domain}");
        }
    }
}
