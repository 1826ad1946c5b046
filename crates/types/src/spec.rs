//! What a sandbox is: its template, limits, environment and network policy.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::limits::Limits;

/// Everything needed to create one sandbox.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxSpec {
    /// Root filesystem template. Built in: `host` (read-only `/usr` of the host, synthesised `/etc`).
    pub template: Template,
    /// Hard limits.
    pub limits: Limits,
    /// Environment variables added to the sandbox's fixed base (PATH, HOME, LANG, ...). Nothing of the host's
    /// environment enters a sandbox unless it is named here.
    pub env: BTreeMap<String, String>,
    /// Network access. Default: none (loopback only).
    pub network: NetworkPolicy,
}

/// A root filesystem template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Template {
    /// Read-only binds of the host's `/usr` (and the `/bin`, `/lib*`, `/sbin` links into it), a synthesised `/etc`.
    #[default]
    Host,
    /// `host`, laid out as E2B programs expect: the user is named `user` and its home (and working directory) is
    /// `/home/user` instead of `/workspace`.
    E2b,
}

/// Network access of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetworkPolicy {
    /// A private network namespace with only `lo`: nothing outside the sandbox is reachable.
    #[default]
    None,
}
