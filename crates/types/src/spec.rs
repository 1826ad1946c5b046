//! What a sandbox is: its template, limits, environment and network policy.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::isolation::Workload;
use crate::limits::Limits;
use crate::tier::Tier;

/// Everything needed to create one sandbox.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxSpec {
    /// How strongly the sandbox is isolated from the host. Unset: the server's default (`[defaults] isolation`),
    /// which is `process` unless configured; the server fills it in before the sandbox exists.
    pub isolation: Option<Tier>,
    /// What the code needs (its kind, I/O profile, whether it needs its own kernel): what `isolation: "auto"`
    /// decides from. Default: nothing said.
    #[serde(skip_serializing_if = "Workload::is_unset")]
    pub workload: Workload,
    /// Root filesystem template. Built in: `host` (read-only `/usr` of the host, synthesised `/etc`).
    pub template: Template,
    /// A built template's layers (and, for a build sandbox, where the step's writes go), as the runtime mounts them at
    /// `/opt`. Set by the CLI or the server from a template's name, never taken from a request (the request types
    /// have no such field). Empty: nothing but the `template`'s root.
    #[serde(skip_serializing_if = "TemplateLayers::is_empty")]
    #[schemars(skip)]
    pub layers: TemplateLayers,
    /// Hard limits.
    pub limits: Limits,
    /// Environment variables added to the sandbox's fixed base (PATH, HOME, LANG, ...). Nothing of the host's
    /// environment enters a sandbox unless it is named here.
    pub env: BTreeMap<String, String>,
    /// Network access. Default: none (loopback only).
    pub network: NetworkPolicy,
    /// Names of the tenant's secrets (`PUT /v1/secrets/{name}`) to expose: each becomes an environment variable of the
    /// same name holding a placeholder; the egress proxy swaps the placeholder for the real value in request headers
    /// sent to the secret's hosts only, over TLS (plain HTTP only to a port a host pattern names). The real value
    /// never enters the sandbox.
    pub secrets: Vec<String>,
}

impl SandboxSpec {
    /// The tier this sandbox runs on (`process` when unset).
    pub fn tier(&self) -> Tier {
        self.isolation.unwrap_or_default()
    }
}

/// A root filesystem template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Template {
    /// Read-only `/usr` of the host (and the `/bin`, `/lib*`, `/sbin` links into it), a synthesised `/etc`.
    #[default]
    Host,
    /// `host`, laid out as E2B programs expect: the user is named `user` and its home (and working directory) is
    /// `/home/user` instead of `/workspace`.
    E2b,
}

/// The layers of a built template as a sandbox mounts them: read-only overlays at the template directory (`/opt`),
/// topmost last in `layers`; a build sandbox also has `capture`, where its step's writes land.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TemplateLayers {
    /// The built template's name, as a sandbox's answers report it (`template`); none for a build sandbox.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Unpacked layer directories on the host (each holding `opt/…`), lowest first.
    pub layers: Vec<std::path::PathBuf>,
    /// A build sandbox's scratch directory on the host (on a size-limited tmpfs): the runtime makes `upper/` and
    /// `work/` in it for the overlay, and what the step wrote is `upper/` afterwards.
    pub capture: Option<std::path::PathBuf>,
    /// The built template's working directory of commands that name none (absolute; the agent creates it as the
    /// sandbox user where it is missing and writable); none: the home.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// The built template's name for the sandbox user (uid 1000) in the synthesised `/etc/passwd` of the `host`
    /// layout; none: the layout's own (`sandbox`; the E2B layout's is always `user`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// Whether `user` may name the sandbox user (uid 1000) in `/etc/passwd`; why not, when not.
pub fn check_user_name(user: &str) -> Result<(), String> {
    if user == "root" {
        return Err("the sandbox user is never root: name the unprivileged user (uid 1000), e.g. \"user\"".to_owned());
    }
    let valid = !user.is_empty()
        && user.len() <= 32
        && user.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && user.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-'));
    if !valid {
        return Err("not a user name: a-z, 0-9, '_' and '-', starting with a letter, at most 32".to_owned());
    }
    Ok(())
}

impl TemplateLayers {
    /// Whether there is nothing to mount.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty() && self.capture.is_none()
    }
}

/// Network access of a sandbox. The sandbox's network namespace never has a route out: every connection leaves
/// through the host's egress proxy (reachable inside at `127.0.0.1:3128`, announced by `HTTP_PROXY` and friends),
/// which applies this policy after resolving the name itself.
///
/// JSON: `{"mode": "allowlist", "allow": ["api.example.com", "*.example.org:443"], "deny": ["bad.example.org"]}`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct NetworkPolicy {
    /// What may be reached.
    pub mode: NetworkMode,
    /// `allowlist` only: host patterns that may be reached: `name`, `*.name` (subdomains only), each with an
    /// optional `:port` (without one: every port; add `:443` to allow only that).
    pub allow: Vec<String>,
    /// Host patterns never reached, whatever `allow` says (deny wins). Valid with `allowlist` and `open`.
    pub deny: Vec<String>,
    /// Inbound: requests to the sandbox's ports through its host name (`PORT-ID.DOMAIN`, E2B's `get_host`) are
    /// served without the sandbox's traffic access token. Default false: only callers holding the token are
    /// served (the owner's `/v1/sandboxes/{id}/ports/…` route needs its API key either way).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub allow_public_traffic: bool,
    /// Headers the egress proxy sets on requests to a host (added, or replacing what the sandbox sent), e.g.
    /// `Authorization: Bearer ${secrets.OPENAI}`: each `${secrets.NAME}` is the tenant secret's value, put in by
    /// the proxy, never seen inside. Only over intercepted TLS (or plain HTTP to a port the host names, not 443).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HeaderRule>,
}

/// One header the egress proxy sets on requests to `host` (see [`NetworkPolicy::headers`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HeaderRule {
    /// A host name, or `*.name` (subdomains), with an optional `:port`; the policy must also allow it.
    pub host: String,
    /// The header's name, e.g. `Authorization`.
    pub name: String,
    /// The header's value; `${secrets.NAME}` stands for the tenant secret `NAME`'s value.
    pub value: String,
}

impl NetworkPolicy {
    /// The default policy: nothing but the sandbox's own loopback.
    pub fn none() -> NetworkPolicy {
        NetworkPolicy::default()
    }

    /// Whether this policy lets anything out (so the sandbox needs a proxy listener).
    pub fn reaches_out(&self) -> bool {
        self.mode != NetworkMode::None
    }
}

/// Where a sandbox's connections to the egress proxy arrive on the host, as the runtime opened it (non-blocking
/// listeners, held by the server while the policy lets anything out).
#[derive(Debug)]
pub enum Entrance {
    /// `127.0.0.1:3128` inside the sandbox's own network namespace (process tier).
    Tcp(std::net::TcpListener),
    /// A host unix socket that the sandbox's agent bridges its `127.0.0.1:3128` to (gVisor: its network stack is
    /// the Sentry's own, which no host listener can join).
    Unix(std::os::unix::net::UnixListener),
}

/// The port of the egress proxy on a sandbox's own loopback (`127.0.0.1:3128` inside; code there cannot bind it).
pub const PROXY_PORT: u16 = 3128;

/// The variables that point a sandbox's HTTP clients (curl, pip, git, requests, urllib, npm) at the egress proxy
/// on its loopback at `port`: `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` and `NO_PROXY` (loopback stays direct), each
/// in upper and lower case (curl reads only `http_proxy`).
pub fn proxy_environment(port: u16) -> BTreeMap<String, String> {
    let proxy = format!("http://127.0.0.1:{port}");
    let mut env: BTreeMap<String, String> = ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"]
        .into_iter()
        .flat_map(|name| [(name.to_owned(), proxy.clone()), (name.to_lowercase(), proxy.clone())])
        .collect();
    for name in ["NO_PROXY", "no_proxy"] {
        env.insert(name.to_owned(), "localhost,127.0.0.1,::1".to_owned());
    }
    env
}

/// The three network modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// A private network namespace with only `lo`: nothing outside the sandbox is reachable, not even the proxy.
    #[default]
    None,
    /// Only the hosts in `allow` (and not in `deny`), through the proxy.
    Allowlist,
    /// Any public address through the proxy (never loopback, private, link-local, CGNAT, ULA or multicast addresses of
    /// the host's networks unless the operator allows such ranges), except the hosts in `deny`.
    Open,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_environment_names_the_port_in_both_cases_and_keeps_loopback_direct() {
        let env = proxy_environment(3128);
        for name in ["HTTP_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"] {
            assert_eq!(env.get(name).map(String::as_str), Some("http://127.0.0.1:3128"), "{name}");
        }
        assert_eq!(env.get("no_proxy").map(String::as_str), Some("localhost,127.0.0.1,::1"));
    }
}
