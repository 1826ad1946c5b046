//! `[[tenants]]`: who may use the server (API keys) and how much each may hold at once (quotas), with the
//! tenant's scan policy and whether it is an admin. Keys never leave: their `Debug` and serialized forms are redacted.

use std::fmt;

use sandkasten_scan::ScanPolicy;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize, Serializer};

use crate::config::isolation::Trust;
use crate::config::problem::Found;
use crate::store::Quota;

/// Shortest accepted API key, in bytes: shorter keys are guessable.
pub const MIN_KEY_BYTES: usize = 16;
/// Longest accepted API key, in bytes.
pub const MAX_KEY_BYTES: usize = 256;

/// An API key: 16 to 256 printable ASCII characters without spaces or commas. Never shown: its `Debug` form (logs)
/// and its serialized form (`GET /v1/config`) are redacted.
#[derive(Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }

    /// The key's bytes, for comparison.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    pub(crate) fn is_well_formed(&self) -> bool {
        (MIN_KEY_BYTES..=MAX_KEY_BYTES).contains(&self.0.len())
            && self.0.bytes().all(|b| b.is_ascii_graphic() && b != b',')
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// One tenant: its keys and quotas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Name, shown in responses and logs.
    pub name: String,
    /// Keys that authenticate as this tenant (`Authorization: Bearer KEY`): 16 to 256 printable ASCII characters
    /// without spaces or commas, each unique. Written out (`GET /v1/config`) as `"<redacted>"`, one per key.
    #[serde(default, serialize_with = "redacted_keys")]
    pub api_keys: Vec<ApiKey>,
    /// Sandboxes running at once. Default 32.
    #[serde(default = "default_max_sandboxes")]
    pub max_sandboxes: u64,
    /// Sum of the memory limits of the running sandboxes, in bytes. Default 8 GiB.
    #[serde(default = "default_max_memory_bytes")]
    pub max_memory_bytes: u64,
    /// Sum of the `pids` limits of the running sandboxes. Default 8192.
    #[serde(default = "default_max_pids")]
    pub max_pids: u64,
    /// Command output the server holds in memory for all of the tenant's sandboxes at once (retained output of
    /// background commands, answers being collected), in bytes; output beyond it is dropped and marked truncated.
    /// Default 256 MiB.
    #[serde(default = "default_max_output_bytes")]
    pub max_output_bytes: u64,
    /// Bytes the tenant's snapshots may take in the snapshot store (compressed, all together); a snapshot that would
    /// exceed it is refused (429). Default 10 GiB.
    #[serde(default = "default_max_snapshot_bytes")]
    pub max_snapshot_bytes: u64,
    /// May change operator-wide settings through the API (resize warm pools) and read the effective config
    /// (`GET /v1/config`). Default false.
    #[serde(default)]
    pub admin: bool,
    /// The tenant's scan policy (replaces the server's `[scan]` for it); requests may only tighten it. Default:
    /// the server's `[scan]`.
    #[serde(default)]
    pub scan: Option<ScanPolicy>,
    /// Whether its code can be trusted not to attack the kernel (`internal`) or not (`untrusted`): what
    /// `isolation: "auto"` asks first (`[isolation.auto]`). Default `untrusted`.
    #[serde(default)]
    pub trust: Trust,
}

impl TenantConfig {
    /// A tenant with the default quotas and no keys.
    pub fn new(name: impl Into<String>) -> Self {
        TenantConfig {
            name: name.into(),
            api_keys: Vec::new(),
            max_sandboxes: default_max_sandboxes(),
            max_memory_bytes: default_max_memory_bytes(),
            max_pids: default_max_pids(),
            max_output_bytes: default_max_output_bytes(),
            max_snapshot_bytes: default_max_snapshot_bytes(),
            admin: false,
            scan: None,
            trust: Trust::Untrusted,
        }
    }

    /// Its quota.
    pub fn quota(&self) -> Quota {
        Quota {
            max_sandboxes: self.max_sandboxes,
            max_memory_bytes: self.max_memory_bytes,
            max_pids: self.max_pids,
            max_output_bytes: self.max_output_bytes,
            max_snapshot_bytes: self.max_snapshot_bytes,
        }
    }
}

fn default_max_sandboxes() -> u64 {
    32
}
fn default_max_memory_bytes() -> u64 {
    8 << 30
}
fn default_max_pids() -> u64 {
    8_192
}
fn default_max_snapshot_bytes() -> u64 {
    10 << 30
}
fn default_max_output_bytes() -> u64 {
    256 << 20
}

/// Writes keys as `"<redacted>"`, one per key: how many there are shows, never what they are.
fn redacted_keys<S: Serializer>(keys: &[ApiKey], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(keys.iter().map(|_| "<redacted>"))
}

/// Whether `name` may name a tenant or a pool: 1 to 64 characters of `[A-Za-z0-9_.-]`.
pub(crate) fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// What a name must be, for problems.
pub(crate) const NAME_RULE: &str = "must be 1 to 64 characters of A-Z, a-z, 0-9, '_', '.', '-'";

/// Checks the tenants' names and keys (each name and key once over all tenants; the keys themselves are never shown)
/// and their scan policies; returns whether any tenant has a key.
pub(crate) fn check(tenants: &[TenantConfig], found: &mut Found) -> bool {
    let mut names = std::collections::BTreeMap::new();
    let mut keys = std::collections::BTreeMap::new();
    for (index, tenant) in tenants.iter().enumerate() {
        let at = format!("tenants[{index}]");
        if !valid_name(&tenant.name) {
            found.add(format!("{at}.name"), format!("tenant name {:?} {NAME_RULE}", tenant.name));
        }
        if let Some(first) = names.insert(tenant.name.as_str(), index) {
            found.add(
                format!("{at}.name"),
                format!("tenant {:?} is configured twice (also tenants[{first}])", tenant.name),
            );
        }
        for (number, key) in tenant.api_keys.iter().enumerate() {
            let path = format!("{at}.api_keys[{number}]");
            if !key.is_well_formed() {
                found.add(
                    &path,
                    format!(
                        "unusable API key (not shown): keys must be {MIN_KEY_BYTES} to {MAX_KEY_BYTES} printable ASCII \
                         characters without spaces or commas"
                    ),
                );
            }
            if let Some(first) = keys.insert(key.as_bytes(), path.clone()) {
                found.add(path, format!("this API key (not shown) is configured more than once: also at {first}"));
            }
        }
        if let Some(scan) = &tenant.scan {
            check_scan(scan, &format!("{at}.scan"), found);
        }
    }
    !keys.is_empty()
}

/// Records what is wrong with the scan policy at `at` (`scan`, `tenants[1].scan`).
pub(crate) fn check_scan(scan: &ScanPolicy, at: &str, found: &mut Found) {
    for problem in scan.problems() {
        match problem {
            sandkasten_scan::PolicyError::EmptyModule(field) => {
                found.add(format!("{at}.{field}"), "an empty module name; remove it");
            }
            other => found.add(at, other),
        }
    }
}
