//! Bodies of the egress routes (network policy, audit, secrets) with their OpenAPI schemas; `NetworkPolicyBody`
//! mirrors `sandkasten_types::NetworkPolicy` (a test checks the JSON shapes agree).

use sandkasten_types::{HeaderRule, NetworkMode, NetworkPolicy};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::egress::store::EgressEvent;

/// Network access of a sandbox. Mirrors `sandkasten_types::NetworkPolicy`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct NetworkPolicyBody {
    /// `none` (default: loopback only), `allowlist` (only `allow`, minus `deny`) or `open` (any public address,
    /// minus `deny`).
    pub mode: NetworkModeName,
    /// Host patterns: `api.example.com`, `*.example.org` (subdomains only), each with an optional `:port` (without
    /// one: every port; add `:443` to allow only that).
    #[schema(example = json!(["api.example.com", "*.example.org:443"]))]
    pub allow: Vec<String>,
    /// Host patterns never reached; deny wins over allow.
    pub deny: Vec<String>,
    /// Inbound: requests to the sandbox's ports through its host name (`PORT-ID.DOMAIN`) are served without the
    /// sandbox's traffic access token. Default false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub allow_public_traffic: bool,
    /// Headers the egress proxy sets on requests to a host (added, or replacing what the sandbox sent); in a value,
    /// `${secrets.NAME}` is the tenant secret's value, put in by the proxy and never seen inside. Only over
    /// intercepted TLS, or plain HTTP to a port the host names (not 443); the host must be allowed and named at
    /// creation (the sandbox's CA vouches for those hosts only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schema(example = json!([{"host": "api.example.com", "name": "Authorization", "value": "Bearer ${secrets.API_TOKEN}"}]))]
    pub headers: Vec<HeaderRuleBody>,
}

/// One header the egress proxy sets on requests to `host`. Mirrors `sandkasten_types::HeaderRule`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HeaderRuleBody {
    /// A host name, or `*.name` (subdomains), with an optional `:port`.
    pub host: String,
    /// The header's name, e.g. `Authorization`.
    pub name: String,
    /// The header's value; `${secrets.NAME}` stands for the tenant secret `NAME`'s value.
    pub value: String,
}

/// The network modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetworkModeName {
    /// Nothing outside the sandbox.
    #[default]
    None,
    /// Only the listed hosts, through the egress proxy.
    Allowlist,
    /// Any public address, through the egress proxy.
    Open,
}

impl From<NetworkPolicyBody> for NetworkPolicy {
    fn from(body: NetworkPolicyBody) -> Self {
        let mode = match body.mode {
            NetworkModeName::None => NetworkMode::None,
            NetworkModeName::Allowlist => NetworkMode::Allowlist,
            NetworkModeName::Open => NetworkMode::Open,
        };
        let headers = body
            .headers
            .into_iter()
            .map(|rule| HeaderRule { host: rule.host, name: rule.name, value: rule.value })
            .collect();
        NetworkPolicy {
            mode,
            allow: body.allow,
            deny: body.deny,
            allow_public_traffic: body.allow_public_traffic,
            headers,
        }
    }
}

impl From<NetworkPolicy> for NetworkPolicyBody {
    fn from(policy: NetworkPolicy) -> Self {
        let mode = match policy.mode {
            NetworkMode::None => NetworkModeName::None,
            NetworkMode::Allowlist => NetworkModeName::Allowlist,
            NetworkMode::Open => NetworkModeName::Open,
        };
        NetworkPolicyBody {
            mode,
            allow: policy.allow,
            deny: policy.deny,
            allow_public_traffic: policy.allow_public_traffic,
            headers: policy
                .headers
                .into_iter()
                .map(|rule| HeaderRuleBody { host: rule.host, name: rule.name, value: rule.value })
                .collect(),
        }
    }
}

/// `GET /v1/sandboxes/{id}/egress`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EgressLog {
    /// The sandbox.
    pub sandbox_id: String,
    /// Its connection attempts through the proxy, oldest first (the newest `limit`).
    pub events: Vec<EgressEvent>,
}

/// `PUT /v1/secrets/{name}`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretRequest {
    /// The secret's value (at most 8 KiB, no control characters: it travels in HTTP headers).
    pub value: String,
    /// Host patterns the value may be sent to (same syntax as an allowlist); at least one. The value travels over TLS
    /// only (intercepted HTTPS), unless a pattern names a plain port: `api.example.com` or `api.example.com:443` never
    /// sends it in plain HTTP, `api.example.com:8080` also sends it in plain HTTP to port 8080.
    #[schema(example = json!(["api.example.com"]))]
    pub hosts: Vec<String>,
    /// Caller metadata (string keys and values: at most 32 entries, keys 128 bytes, values 1024, 8192 bytes in
    /// all); replaces what the secret had. Left out: kept.
    #[serde(default)]
    pub metadata: Option<std::collections::BTreeMap<String, String>>,
}

/// A secret as the API shows it: never its value.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SecretBody {
    /// Its id (`sec_` + 16 hex digits; E2B's `secretID`), which never changes.
    pub id: String,
    /// Name; a sandbox created with `"secrets": [NAME]` gets `NAME=<placeholder>` in its environment.
    pub name: String,
    /// Host patterns the value may be sent to (over TLS; plain HTTP only to a port a pattern names, not 443). Empty
    /// for a secret made through E2B's `/secrets`: it goes only where a header rule puts it.
    pub hosts: Vec<String>,
    /// Caller metadata.
    pub metadata: std::collections::BTreeMap<String, String>,
    /// 1 when created, one more with every write of the value.
    pub version: i64,
    /// When it was created (RFC 3339, UTC).
    pub created_at: String,
    /// When it was last written (RFC 3339, UTC).
    pub updated_at: String,
}

/// `GET /v1/secrets`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SecretList {
    /// The tenant's secrets, by name.
    pub secrets: Vec<SecretBody>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_mirror_has_the_shape_of_the_original() {
        let json = r#"{"mode":"allowlist","allow":["a.example:443"],"deny":["b.example"],
            "headers":[{"host":"a.example","name":"X-Key","value":"k ${secrets.K}"}]}"#;
        let original: NetworkPolicy = serde_json::from_str(json).unwrap();
        let mirror: NetworkPolicyBody = serde_json::from_str(json).unwrap();
        assert_eq!(NetworkPolicy::from(mirror.clone()), original);
        assert_eq!(serde_json::to_value(&mirror).unwrap(), serde_json::to_value(&original).unwrap());
        assert_eq!(NetworkPolicyBody::from(NetworkPolicy::none()), NetworkPolicyBody::default());
    }
}
