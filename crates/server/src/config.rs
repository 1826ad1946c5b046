//! The server's configuration: a TOML file (`sandkasten serve --config sandkasten.toml`) plus API keys from the
//! environment (`SANDKASTEN_API_KEYS="tenant:key,tenant2:key2"`), validated as a whole before anything starts.
//!
//! ```toml
//! listen = "127.0.0.1:8080"                       # address:port; insecure_no_auth needs a loopback address
//! database = "/var/lib/sandkasten/sandkasten.db"  # SQLite file, created when missing
//! default_timeout_s = 300                         # lifetime of a sandbox created without timeout_s
//! max_timeout_s = 86400                           # largest timeout_s a client may ask for
//! max_pids = 8192                                 # largest limits.pids of one sandbox; default kernel.pid_max / 4
//! max_retained_output_bytes = 67108864            # command output the server holds for one sandbox at once
//!
//! [defaults]                                      # what a request that does not say gets
//! isolation = "gvisor"                            # tier of creates naming none: "process" (default) or "gvisor"
//!
//! [[tenants]]
//! name = "acme"
//! api_keys = ["a-long-random-key-of-16-bytes-or-more"]
//! max_sandboxes = 32                              # running at once
//! max_memory_bytes = 8589934592                   # sum of the running sandboxes' memory limits
//! max_pids = 8192                                 # sum of the running sandboxes' pids limits
//! max_output_bytes = 268435456                    # command output the server holds for all its sandboxes at once
//! admin = false                                   # may resize the warm pools (PUT /v1/pools/{name})
//! scan = { mode = "enforce", python = { allow_imports = ["numpy", "json"] } }  # the tenant's scan policy (below)
//!
//! [[pools]]                                       # warm pool (none by default): sandboxes created ahead of time
//! name = "default"                                # label of the sandkasten_pool_size metric; default "pool-N"
//! isolation = "process"                           # tier of its members; default [defaults] isolation
//! limits = { memory_bytes = 268435456 }           # omitted fields take their defaults, as in POST /v1/sandboxes
//! min = 2                                         # ready sandboxes kept (refilled in the background)
//! max = 8                                         # never more than this many, ready or being created
//! zygote = "python"                               # optional: "python" or "node", an interpreter waiting in each member
//! preload = ["json"]                              # modules the zygote imports ahead of time (needs zygote)
//!
//! [scan]                                          # the static scan before runs (default for tenants without scan)
//! mode = "warn"                                   # "off" (default) | "warn" (run, carry findings) | "enforce" (refuse)
//! block = ["high", "critical"]                    # severities that refuse code in enforce (the default)
//! python = { deny_imports = ["ctypes"] }          # allow_imports / deny_imports per language (python, javascript)
//!
//! [metrics]
//! require_auth = false                            # true: GET /metrics needs an API key (any tenant's)
//!
//! [http]
//! header_read_timeout_ms = 10000                  # a request head must arrive within this (else: closed)
//! max_connections = 4096                          # open at once (beyond: they wait in the backlog)
//! max_connections_per_client = 512                # open at once from one address (beyond: closed)
//!
//! [retention]                                     # what the database keeps of ended things
//! days = 7                                        # ended sandboxes, commands, egress events older are removed
//! max_ended_sandboxes = 100000                    # and the oldest ended sandboxes beyond this many
//!
//! [egress]                                        # the egress proxy (sandboxes with a network policy other than none)
//! hosts = { "allowed.test" = ["10.200.1.2"] }     # static resolver entries (air-gapped setups, tests)
//!                                                 # (names only in /etc/hosts: list them here; the proxy
//!                                                 # asks the resolver for absolute names, which it does not)
//! allow_cidrs = ["10.200.1.0/24"]                 # special ranges (private, link-local...) sandboxes may still reach
//! upstream_ca_file = "/etc/sandkasten/upstream-ca.pem"  # extra roots for upstream TLS when intercepting (secrets)
//! max_connections = 256                           # proxy connections one sandbox holds at once (more wait)
//! max_total_connections = 4096                    # of all sandboxes together (two descriptors each, reserved at start)
//! max_tenant_connections = 1024                   # of one tenant's sandboxes together
//!
//! [secrets]                                       # the key sealing secret values in the database (XChaCha20-Poly1305)
//! key_file = "/etc/sandkasten/secrets.key"        # 32 bytes as 64 hex characters or base64, mode 0600; or instead:
//! # key_env = "SANDKASTEN_SECRETS_KEY"            # a variable holding the key ("new,old" while rotating)
//! previous_key_files = ["/etc/sandkasten/old.key"]  # while rotating: re-sealed under key_file at start, then remove
//!                                                 # (neither key_file nor key_env: <database>.secrets-key, made at
//!                                                 # the first start; keep a copy elsewhere, see docs/operations.md)
//!
//! [snapshots]                                     # where snapshots are kept (content-addressed zstd chunks + manifests)
//! store = "file:///var/lib/sandkasten/snapshots"  # default: <database directory>/snapshots; or "s3://bucket/prefix"
//! # s3_endpoint = "https://s3.internal:9000"      # S3 settings (unset: the AWS_* environment variables)
//! # s3_region = "eu-central-1"
//! # s3_access_key_id = "…"                        # (prefer AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)
//! gc_grace_s = 3600                               # unreferenced chunks younger than this survive a GC
//!
//! [mcp]                                           # the MCP endpoint (/mcp) and `sandkasten mcp`'s sessions
//! max_sessions_per_tenant = 16                    # open at once per tenant (one more initialize: 429)
//! idle_timeout_s = 600                            # a session idle this long ends, killing its sandboxes
//! ```
//!
//! A create (or `POST /v1/run`) whose isolation tier, template and limits equal a pool's and whose `env` is empty
//! takes a ready sandbox from that pool; anything else is created fresh. A pool refills to `min`, raised by one per recent miss up
//! to `max` (each 10 s without a miss lowers it by one). `GET /v1/pools` shows every pool's sizes and counts;
//! `PUT /v1/pools/{name}` `{"min", "max"}` (admin tenants only; `0 <= min <= max <= 1024`) resizes one until the
//! server restarts.

mod defaults;
mod mcp;
mod secrets;
mod snapshots;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use sandkasten_scan::ScanPolicy;
use sandkasten_types::{Limits, Template, Tier};
use serde::Deserialize;
use thiserror::Error;

use crate::store::Quota;

pub use defaults::Defaults;
pub use mcp::McpConfig;
pub use secrets::SecretsConfig;
pub use snapshots::SnapshotsConfig;

/// Name of the environment variable holding extra API keys.
pub const API_KEYS_ENV: &str = "SANDKASTEN_API_KEYS";

/// Shortest accepted API key, in bytes: shorter keys are guessable.
pub const MIN_KEY_BYTES: usize = 16;
/// Longest accepted API key, in bytes.
pub const MAX_KEY_BYTES: usize = 256;

/// A configuration that cannot be used, with what to change.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// A scan policy (`[scan]`, or a tenant's `scan`) is unusable.
    #[error("{}: {problem}", tenant.as_ref().map_or_else(|| "[scan]".to_owned(), |t| format!("tenant {t}: scan")))]
    Scan {
        /// The tenant whose policy it is; `None` for the server's `[scan]`.
        tenant: Option<String>,
        /// What is wrong.
        problem: String,
    },
    /// The `[secrets]` table is unusable.
    #[error("[secrets] {0}")]
    Secrets(String),
    /// The `[metrics]` table is unusable.
    #[error("[metrics] {0}")]
    Metrics(String),
    /// The `[egress]` table is unusable (a bad CIDR, host entry or file).
    #[error("[egress]: {0}")]
    Egress(String),
    /// The `[snapshots]` store cannot be opened (a bad url, a directory that cannot be made).
    #[error("[snapshots]: {0}")]
    Snapshots(String),
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has unknown/mistyped fields.
    #[error("invalid config file: {0}")]
    Parse(#[from] toml::de::Error),
    /// `listen` is not an IP address with a port.
    #[error("listen = {0:?} is not an address with a port, e.g. \"127.0.0.1:8080\" or \"[::1]:8080\"")]
    Listen(String),
    /// Authentication is off on a non-loopback address.
    #[error(
        "insecure_no_auth is only allowed when listening on a loopback address (127.0.0.1 or ::1), not {0}: \
         configure API keys instead"
    )]
    InsecureNotLoopback(SocketAddr),
    /// No key is configured and authentication is on.
    #[error(
        "no API keys: add [[tenants]] with api_keys to the config file or set {API_KEYS_ENV}=\"tenant:key\" \
         (or insecure_no_auth = true on a loopback address, for local use only)"
    )]
    NoKeys,
    /// A tenant name is empty, too long or has characters outside `[A-Za-z0-9_.-]`.
    #[error("tenant name {0:?} must be 1 to 64 characters of A-Z, a-z, 0-9, '_', '.', '-'")]
    TenantName(String),
    /// The same tenant is configured twice in the file.
    #[error("tenant {0:?} is configured twice")]
    DuplicateTenant(String),
    /// A key is too short, too long or contains spaces or control characters (the key itself is not shown).
    #[error(
        "an API key of tenant {tenant:?} is unusable: keys must be {MIN_KEY_BYTES} to {MAX_KEY_BYTES} printable \
         ASCII characters without spaces or commas"
    )]
    KeyFormat {
        /// The tenant the key belongs to.
        tenant: String,
    },
    /// The same key is given twice (the key itself is not shown).
    #[error("an API key of tenant {tenant:?} is configured more than once")]
    DuplicateKey {
        /// The tenant of the second occurrence.
        tenant: String,
    },
    /// An entry of `SANDKASTEN_API_KEYS` is not `tenant:key`.
    #[error("{API_KEYS_ENV} entry number {0} is not of the form tenant:key")]
    EnvEntry(usize),
    /// The timeouts are inconsistent.
    #[error("timeouts must satisfy 1 <= default_timeout_s <= max_timeout_s <= 604800, got {default} and {max}")]
    Timeouts {
        /// `default_timeout_s`.
        default: u64,
        /// `max_timeout_s`.
        max: u64,
    },
    /// A size setting is zero or absurdly large.
    #[error("{name} must be between 1 and {max} bytes, got {got}")]
    Size {
        /// The setting.
        name: &'static str,
        /// Largest accepted value.
        max: u64,
        /// The value given.
        got: u64,
    },
    /// An isolation tier this build cannot run is configured (`microvm`, `auto`), or one this host cannot.
    #[error("{0}")]
    Isolation(String),
    /// The `[retention]` table is out of range.
    #[error("[retention] days must be 1 to 3650 and max_ended_sandboxes at least 1, got {0:?}")]
    Retention(RetentionConfig),
    /// The `[http]` table is unusable, or the process may not open enough descriptors for it.
    #[error("[http] {0}")]
    Http(String),
    /// The `[mcp]` table is unusable.
    #[error("[mcp] {0}")]
    Mcp(String),
    /// A `[[pools]]` entry is unusable.
    #[error("pool {name:?}: {problem}")]
    Pool {
        /// The pool's name.
        name: String,
        /// What is wrong.
        problem: String,
    },
}

/// An API key. Its `Debug` form is redacted so that logging a config never shows a key.
#[derive(Clone, PartialEq, Eq, Deserialize)]
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

    fn is_well_formed(&self) -> bool {
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
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Name, shown in responses and logs.
    pub name: String,
    /// Keys that authenticate as this tenant (`Authorization: Bearer KEY`).
    #[serde(default)]
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
    /// May change operator-wide settings through the API (resize warm pools). Default false.
    #[serde(default)]
    pub admin: bool,
    /// The tenant's scan policy (replaces the server's `[scan]` for it); requests may only tighten it. Default:
    /// the server's `[scan]`.
    #[serde(default)]
    pub scan: Option<ScanPolicy>,
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

/// Largest `max` of a pool.
pub const MAX_POOL_SIZE: usize = 1024;

/// One warm pool: sandboxes of one template and limits class, created ahead of time.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Name (the `class` label of `sandkasten_pool_size`). Default `pool-N` (N = position in the file, from 1).
    #[serde(default)]
    pub name: Option<String>,
    /// Isolation tier of the pool's sandboxes. Default `[defaults] isolation`.
    #[serde(default)]
    pub isolation: Option<Tier>,
    /// Template of the pool's sandboxes. Default `host`.
    #[serde(default)]
    pub template: Template,
    /// Limits of the pool's sandboxes; omitted fields take their defaults.
    #[serde(default)]
    pub limits: Limits,
    /// Ready sandboxes kept. Default 2.
    #[serde(default = "default_pool_min")]
    pub min: usize,
    /// Most sandboxes the pool holds, ready or being created. Default 8.
    #[serde(default = "default_pool_max")]
    pub max: usize,
    /// An interpreter started in each member once it is created; one-shot runs of its language fork from it. Each
    /// member also holds a spare code-context kernel of that language (with the same preload), which the sandbox's
    /// first code context of the language adopts.
    #[serde(default)]
    pub zygote: Option<ZygoteKind>,
    /// Modules the zygote and the spare kernel import (Python) or require (Node) before they wait: dotted names of identifiers, so Node
    /// preloads builtins and installed packages by plain name (`fs`, `lodash`). Needs `zygote`.
    #[serde(default)]
    pub preload: Vec<String>,
}

/// The interpreter of a pool's zygote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ZygoteKind {
    /// `python3`, serving `POST /v1/run` with `language = "python"`.
    Python,
    /// `node`, serving `POST /v1/run` with `language = "node"`.
    Node,
}

impl ZygoteKind {
    /// The code-context language of the same interpreter.
    pub fn language(self) -> sandkasten_types::CodeLanguage {
        match self {
            ZygoteKind::Python => sandkasten_types::CodeLanguage::Python,
            ZygoteKind::Node => sandkasten_types::CodeLanguage::Javascript,
        }
    }
}

/// Most modules a zygote may preload.
pub const MAX_PRELOAD: usize = 64;

/// Whether `name` is a dotted module name: identifiers (ASCII letters, digits, `_`, not starting with a digit)
/// joined by single dots, at most 255 bytes.
pub fn valid_module_name(name: &str) -> bool {
    (1..=255).contains(&name.len())
        && name.split('.').all(|part| {
            part.bytes().next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        })
}

fn default_pool_min() -> usize {
    2
}
fn default_pool_max() -> usize {
    8
}

impl PoolConfig {
    /// The pool's name: its own, or `pool-N` for the `index`-th pool (from 0).
    pub fn name_at(&self, index: usize) -> String {
        self.name.clone().unwrap_or_else(|| format!("pool-{}", index + 1))
    }

    /// The pool's isolation tier: its own, or `default` (the server's `[defaults] isolation`).
    pub fn tier(&self, default: Tier) -> Tier {
        self.isolation.unwrap_or(default)
    }
}

/// Everything `sandkasten serve` needs to know.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address and port to listen on. Default `127.0.0.1:8080`.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// SQLite database file. Default `/var/lib/sandkasten/sandkasten.db`.
    #[serde(default = "default_database")]
    pub database: PathBuf,
    /// Lifetime of a sandbox created without `timeout_s`, in seconds. Default 300.
    #[serde(default = "default_timeout_s")]
    pub default_timeout_s: u64,
    /// Largest `timeout_s` a client may ask for, in seconds. Default 86 400 (one day).
    #[serde(default = "default_max_timeout_s")]
    pub max_timeout_s: u64,
    /// Largest file read or written through the files API, in bytes. Default 64 MiB.
    #[serde(default = "default_max_file_bytes")]
    pub max_file_bytes: u64,
    /// Largest JSON request body, in bytes. Default 4 MiB.
    #[serde(default = "default_max_json_bytes")]
    pub max_json_bytes: u64,
    /// Largest `limits.pids` one sandbox may ask for. Default (and at most) what the host allows one sandbox: a
    /// quarter of `kernel.pid_max`.
    #[serde(default)]
    pub max_pids: Option<u64>,
    /// Command output the server holds in its memory for one sandbox at once (all its commands' retained output
    /// and answers being collected), in bytes; output beyond it is dropped and marked truncated. Default 64 MiB.
    #[serde(default = "default_max_retained_output_bytes")]
    pub max_retained_output_bytes: u64,
    /// Serve without authentication, everything as tenant `default`. Only on a loopback address. Default false.
    #[serde(default)]
    pub insecure_no_auth: bool,
    /// What requests that leave a setting out get (`[defaults] isolation`).
    #[serde(default)]
    pub defaults: Defaults,
    /// Tenants with their keys and quotas.
    #[serde(default)]
    pub tenants: Vec<TenantConfig>,
    /// Warm pools. Default none.
    #[serde(default)]
    pub pools: Vec<PoolConfig>,
    /// The egress proxy: static host entries, special-range CIDRs the operator allows, upstream TLS roots.
    #[serde(default)]
    pub egress: sandkasten_egress::EgressConfig,
    /// How the gvisor tier runs runsc: `[gvisor] runsc = "/usr/bin/runsc"`, `platform = "systrap"` (or `"ptrace"`).
    #[serde(default)]
    pub gvisor: sandkasten_types::GvisorSettings,
    /// The `/metrics` endpoint (`[metrics] require_auth = true`).
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// Connections of the HTTP server (`[http]`): the header-read timeout and the connection caps.
    #[serde(default)]
    pub http: HttpConfig,
    /// How long the database keeps what ended (`[retention]`).
    #[serde(default)]
    pub retention: RetentionConfig,
    /// Where the key sealing secret values comes from (`[secrets]`).
    #[serde(default)]
    pub secrets: SecretsConfig,
    /// Where snapshots are kept (`[snapshots]`).
    #[serde(default)]
    pub snapshots: SnapshotsConfig,
    /// The scan policy of tenants that have none of their own (`[scan]`). Default mode `off`.
    #[serde(default)]
    pub scan: ScanPolicy,
    /// Bounds of the MCP endpoint (`[mcp]`): sessions per tenant, idle expiry.
    #[serde(default)]
    pub mcp: McpConfig,
}

/// What the database keeps of ended sandboxes, commands and egress events (`[retention]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Days an ended sandbox (with its commands and egress events), an ended command or an egress event is kept.
    /// Default 7.
    pub days: u64,
    /// Ended sandboxes kept at most (the oldest beyond are removed). Default 100 000.
    pub max_ended_sandboxes: u64,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig { days: 7, max_ended_sandboxes: 100_000 }
    }
}

/// The HTTP server's connections (`[http]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// A connection whose request head (line and headers) has not arrived this many milliseconds after it opened,
    /// or after its previous response, is closed. Default 10 000.
    pub header_read_timeout_ms: u64,
    /// Connections open at once; beyond it new ones wait in the kernel's backlog. Default 4096.
    pub max_connections: usize,
    /// Connections open at once from one client address; more are closed at once. Default 512.
    pub max_connections_per_client: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig { header_read_timeout_ms: 10_000, max_connections: 4096, max_connections_per_client: 512 }
    }
}

impl HttpConfig {
    /// Why these values are unusable.
    fn problem(&self) -> Option<String> {
        let HttpConfig { header_read_timeout_ms, max_connections, max_connections_per_client } = *self;
        if !(100..=600_000).contains(&header_read_timeout_ms) {
            return Some(format!("header_read_timeout_ms must be 100 to 600000, got {header_read_timeout_ms}"));
        }
        if !(1..=1 << 20).contains(&max_connections) {
            return Some(format!("max_connections must be 1 to 1048576, got {max_connections}"));
        }
        if !(1..=max_connections).contains(&max_connections_per_client) {
            return Some(format!(
                "max_connections_per_client must be 1 to max_connections ({max_connections}), got \
                 {max_connections_per_client}"
            ));
        }
        None
    }
}

/// The Prometheus endpoint `GET /metrics`, and the per-sandbox usage samples of `GET /v1/sandboxes/{id}/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Require an API key (any tenant's, `Authorization: Bearer KEY`) to read `/metrics`. Default false: a scraper
    /// on a trusted network reads it without one.
    pub require_auth: bool,
    /// How often every running sandbox's usage (CPU, memory, disk) is sampled, in seconds (1 to 3600). Default 5.
    pub sample_interval_s: u64,
    /// Samples kept per running sandbox in the server's memory (1 to 100 000; about 60 bytes each). Default 720
    /// (an hour at the default interval).
    pub samples_kept: usize,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig { require_auth: false, sample_interval_s: 5, samples_kept: 720 }
    }
}

impl MetricsConfig {
    /// What is wrong with these settings, if anything.
    fn problem(&self) -> Option<String> {
        if !(1..=3600).contains(&self.sample_interval_s) {
            return Some(format!("sample_interval_s must be 1 to 3600 seconds, got {}", self.sample_interval_s));
        }
        if !(1..=100_000).contains(&self.samples_kept) {
            return Some(format!("samples_kept must be 1 to 100000, got {}", self.samples_kept));
        }
        None
    }
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}
fn default_database() -> PathBuf {
    PathBuf::from("/var/lib/sandkasten/sandkasten.db")
}
fn default_timeout_s() -> u64 {
    300
}
fn default_max_timeout_s() -> u64 {
    86_400
}
fn default_max_file_bytes() -> u64 {
    64 << 20
}
fn default_max_json_bytes() -> u64 {
    4 << 20
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

fn default_max_retained_output_bytes() -> u64 {
    64 << 20
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: default_listen(),
            database: default_database(),
            default_timeout_s: default_timeout_s(),
            max_timeout_s: default_max_timeout_s(),
            max_file_bytes: default_max_file_bytes(),
            max_json_bytes: default_max_json_bytes(),
            max_pids: None,
            max_retained_output_bytes: default_max_retained_output_bytes(),
            insecure_no_auth: false,
            defaults: Defaults::default(),
            tenants: Vec::new(),
            pools: Vec::new(),
            metrics: MetricsConfig::default(),
            http: HttpConfig::default(),
            retention: RetentionConfig::default(),
            egress: sandkasten_egress::EgressConfig::default(),
            gvisor: sandkasten_types::GvisorSettings::default(),
            secrets: SecretsConfig::default(),
            snapshots: SnapshotsConfig::default(),
            scan: ScanPolicy::default(),
            mcp: McpConfig::default(),
        }
    }
}

/// Longest accepted sandbox lifetime a config may allow: one week.
const MAX_CONFIGURABLE_TIMEOUT_S: u64 = 7 * 24 * 3600;

impl ServerConfig {
    /// Parses a config file's text (not yet validated).
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        Ok(toml::from_str(text)?)
    }

    /// Reads a config file (not yet validated).
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        Self::from_toml_str(&text)
    }

    /// The whole configuration as `sandkasten serve` uses it: the file (or defaults), plus the keys of
    /// `SANDKASTEN_API_KEYS`, validated.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let mut config = match path {
            Some(path) => Self::from_file(path)?,
            None => ServerConfig::default(),
        };
        if let Ok(value) = std::env::var(API_KEYS_ENV) {
            config.add_env_keys(&value)?;
        }
        config.validate()?;
        Ok(config)
    }

    /// Adds the keys of a `SANDKASTEN_API_KEYS` value (`tenant:key,tenant2:key2`); a tenant not in the file gets the
    /// default quotas.
    pub fn add_env_keys(&mut self, value: &str) -> Result<(), ConfigError> {
        for (index, entry) in value.split(',').map(str::trim).enumerate() {
            if entry.is_empty() {
                continue;
            }
            let (tenant, key) = entry.split_once(':').ok_or(ConfigError::EnvEntry(index + 1))?;
            if tenant.is_empty() || key.is_empty() {
                return Err(ConfigError::EnvEntry(index + 1));
            }
            let position = match self.tenants.iter().position(|t| t.name == tenant) {
                Some(position) => position,
                None => {
                    self.tenants.push(TenantConfig::new(tenant));
                    self.tenants.len() - 1
                }
            };
            self.tenants[position].api_keys.push(ApiKey::new(key));
        }
        Ok(())
    }

    /// The listen address.
    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        self.listen.parse().map_err(|_| ConfigError::Listen(self.listen.clone()))
    }

    /// Checks the whole configuration; the first problem found is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let addr = self.listen_addr()?;
        if self.insecure_no_auth && !addr.ip().is_loopback() {
            return Err(ConfigError::InsecureNotLoopback(addr));
        }
        let (default, max) = (self.default_timeout_s, self.max_timeout_s);
        if !(1 <= default && default <= max && max <= MAX_CONFIGURABLE_TIMEOUT_S) {
            return Err(ConfigError::Timeouts { default, max });
        }
        for (name, got, max) in [
            ("max_file_bytes", self.max_file_bytes, 1 << 40),
            ("max_json_bytes", self.max_json_bytes, 1 << 30),
            ("max_retained_output_bytes", self.max_retained_output_bytes, 1 << 40),
        ] {
            if !(1..=max).contains(&got) {
                return Err(ConfigError::Size { name, max, got });
            }
        }
        if !(1..=3650).contains(&self.retention.days) || self.retention.max_ended_sandboxes == 0 {
            return Err(ConfigError::Retention(self.retention));
        }
        if let Some(problem) = self.http.problem() {
            return Err(ConfigError::Http(problem));
        }
        if let Some(problem) = self.mcp.problem() {
            return Err(ConfigError::Mcp(problem));
        }
        if let Some(problem) = self.secrets.problem() {
            return Err(ConfigError::Secrets(problem));
        }
        if let Some(problem) = self.metrics.problem() {
            return Err(ConfigError::Metrics(problem));
        }
        if let Some(got) = self.max_pids
            && !(1..=sandkasten_types::MAX_PIDS).contains(&got)
        {
            return Err(ConfigError::Size { name: "max_pids", max: sandkasten_types::MAX_PIDS, got });
        }
        let mut names = std::collections::BTreeSet::new();
        let mut keys = std::collections::BTreeSet::new();
        for tenant in &self.tenants {
            if !valid_tenant_name(&tenant.name) {
                return Err(ConfigError::TenantName(tenant.name.clone()));
            }
            if !names.insert(tenant.name.as_str()) {
                return Err(ConfigError::DuplicateTenant(tenant.name.clone()));
            }
            for key in &tenant.api_keys {
                if !key.is_well_formed() {
                    return Err(ConfigError::KeyFormat { tenant: tenant.name.clone() });
                }
                if !keys.insert(key.as_bytes()) {
                    return Err(ConfigError::DuplicateKey { tenant: tenant.name.clone() });
                }
            }
        }
        self.scan.check().map_err(|error| ConfigError::Scan { tenant: None, problem: error.to_string() })?;
        for tenant in &self.tenants {
            if let Some(scan) = &tenant.scan {
                let problem = |error: sandkasten_scan::PolicyError| ConfigError::Scan {
                    tenant: Some(tenant.name.clone()),
                    problem: error.to_string(),
                };
                scan.check().map_err(problem)?;
            }
        }
        if !self.insecure_no_auth && keys.is_empty() {
            return Err(ConfigError::NoKeys);
        }
        self.egress.validate().map_err(|error| ConfigError::Egress(error.to_string()))?;
        if let Some(problem) = defaults::tier_problem("[defaults] isolation", self.defaults.isolation) {
            return Err(ConfigError::Isolation(problem));
        }
        self.validate_pools()
    }

    fn validate_pools(&self) -> Result<(), ConfigError> {
        let mut names = std::collections::BTreeSet::new();
        for (index, pool) in self.pools.iter().enumerate() {
            let name = pool.name_at(index);
            let problem = |problem: String| ConfigError::Pool { name: name.clone(), problem };
            if !valid_tenant_name(&name) {
                return Err(problem("the name must be 1 to 64 characters of A-Z, a-z, 0-9, '_', '.', '-'".into()));
            }
            if !names.insert(name.clone()) {
                return Err(problem("configured twice".into()));
            }
            if let Some(reason) = defaults::tier_problem("isolation", pool.tier(self.defaults.isolation)) {
                return Err(problem(reason));
            }
            pool.limits.validate().map_err(|e| problem(format!("limits: {e}")))?;
            if !(1 <= pool.min && pool.min <= pool.max && pool.max <= MAX_POOL_SIZE) {
                return Err(problem(format!(
                    "sizes must satisfy 1 <= min <= max <= {MAX_POOL_SIZE}, got min {} and max {}",
                    pool.min, pool.max
                )));
            }
            if pool.zygote.is_none() && !pool.preload.is_empty() {
                return Err(problem("preload needs a zygote (zygote = \"python\" or \"node\")".into()));
            }
            if pool.preload.len() > MAX_PRELOAD {
                return Err(problem(format!("at most {MAX_PRELOAD} preload modules, got {}", pool.preload.len())));
            }
            if let Some(bad) = pool.preload.iter().find(|name| !valid_module_name(name)) {
                return Err(problem(format!("preload: {bad:?} is not a dotted module name")));
            }
            let tier = |pool: &PoolConfig| pool.tier(self.defaults.isolation);
            let same = |other: &PoolConfig| {
                tier(other) == tier(pool) && other.template == pool.template && other.limits == pool.limits
            };
            if self.pools[..index].iter().any(same) {
                return Err(problem("another pool has the same isolation, template and limits".into()));
            }
        }
        Ok(())
    }
}

fn valid_tenant_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "0123456789abcdef-key";

    fn with_key() -> ServerConfig {
        let mut config = ServerConfig::default();
        config.add_env_keys(&format!("acme:{KEY}")).map_err(|e| e.to_string()).ok();
        config
    }

    #[test]
    fn file_with_tenants_parses_and_validates() -> Result<(), ConfigError> {
        let text = format!(
            "listen = \"0.0.0.0:9000\"\ndatabase = \"/tmp/x.db\"\ndefault_timeout_s = 60\nmax_timeout_s = 3600\n\
             [[tenants]]\nname = \"acme\"\napi_keys = [\"{KEY}\"]\nmax_sandboxes = 2\nmax_memory_bytes = 1073741824\n"
        );
        let config = ServerConfig::from_toml_str(&text)?;
        config.validate()?;
        assert_eq!(config.tenants[0].max_sandboxes, 2);
        assert_eq!(config.default_timeout_s, 60);
        assert_eq!(config.database, PathBuf::from("/tmp/x.db"));
        Ok(())
    }

    #[test]
    fn scan_policies_parse_per_tenant_and_bad_ones_name_their_tenant() -> Result<(), ConfigError> {
        let text = format!(
            "[scan]\nmode = \"warn\"\n[[tenants]]\nname = \"acme\"\napi_keys = [\"{KEY}\"]\n\
             scan = {{ mode = \"enforce\", python = {{ allow_imports = [\"json\"] }} }}\n"
        );
        let config = ServerConfig::from_toml_str(&text)?;
        config.validate()?;
        assert_eq!(config.scan.mode, sandkasten_scan::Mode::Warn);
        let tenant = config.tenants[0].scan.as_ref().map(|s| (s.mode, s.python.allow_imports.clone()));
        assert_eq!(tenant, Some((sandkasten_scan::Mode::Enforce, Some(vec!["json".to_owned()]))));
        let mut bad = config.clone();
        bad.tenants[0].scan = Some(ScanPolicy {
            python: sandkasten_scan::ImportPolicy { allow_imports: None, deny_imports: vec![String::new()] },
            ..ScanPolicy::default()
        });
        let message = bad.validate().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("tenant acme: scan") && message.contains("deny_imports"), "{message}");
        let misspelt = "[scan]\nmode = \"enforcing\"\n";
        assert!(ServerConfig::from_toml_str(misspelt).is_err());
        Ok(())
    }

    #[test]
    fn pools_parse_with_defaults_and_bad_ones_are_refused() -> Result<(), ConfigError> {
        let text = format!(
            "[[tenants]]\nname = \"acme\"\napi_keys = [\"{KEY}\"]\n\
             [[pools]]\nlimits = {{ memory_bytes = 67108864 }}\nmin = 3\n\
             [[pools]]\nname = \"small\"\nlimits = {{ pids = 16 }}\n"
        );
        let config = ServerConfig::from_toml_str(&text)?;
        config.validate()?;
        assert_eq!(config.pools.len(), 2);
        assert_eq!((config.pools[0].min, config.pools[0].max), (3, 8));
        assert_eq!(config.pools[0].limits.memory_bytes, 64 << 20);
        assert_eq!(config.pools[0].limits.pids, Limits::default().pids);
        assert_eq!(config.pools[0].name_at(0), "pool-1");
        assert_eq!(config.pools[1].name_at(1), "small");
        let mut bad = config.clone();
        bad.pools[0].min = 9;
        assert!(matches!(bad.validate(), Err(ConfigError::Pool { .. })));
        let mut bad = config.clone();
        bad.pools[1].limits = bad.pools[0].limits.clone();
        assert!(matches!(bad.validate(), Err(ConfigError::Pool { .. })));
        let mut bad = config;
        bad.pools[0].limits.memory_bytes = 1;
        assert!(matches!(bad.validate(), Err(ConfigError::Pool { .. })));
        Ok(())
    }

    #[test]
    fn zygote_pools_parse_and_their_preload_lists_are_validated() -> Result<(), ConfigError> {
        let config = ServerConfig::from_toml_str(&format!(
            "[[tenants]]\nname = \"a\"\napi_keys = [\"{KEY}\"]\n\
             [[pools]]\nzygote = \"python\"\npreload = [\"json\", \"os.path\", \"_x1\"]\n\
             [[pools]]\nlimits = {{ pids = 16 }}\n"
        ))?;
        config.validate()?;
        assert_eq!(config.pools[0].zygote, Some(ZygoteKind::Python));
        assert_eq!(config.pools[0].preload, ["json", "os.path", "_x1"]);
        assert_eq!((config.pools[1].zygote, config.pools[1].preload.len()), (None, 0));
        for bad_name in ["", "1json", "json.", ".json", "a..b", "a-b", "json; import os", "a b", "é"] {
            let mut bad = config.clone();
            bad.pools[0].preload = vec![bad_name.to_owned()];
            assert!(matches!(bad.validate(), Err(ConfigError::Pool { .. })), "{bad_name:?}");
        }
        let mut bad = config.clone();
        bad.pools[1].preload = vec!["json".into()];
        let message = bad.validate().map_err(|e| e.to_string()).err().unwrap_or_default();
        assert!(message.contains("needs a zygote"), "{message}");
        let mut bad = config;
        bad.pools[0].preload = vec!["json".into(); MAX_PRELOAD + 1];
        assert!(matches!(bad.validate(), Err(ConfigError::Pool { .. })));
        assert!(ServerConfig::from_toml_str("[[pools]]\nzygote = \"ruby\"\n").is_err());
        Ok(())
    }

    #[test]
    fn the_default_tier_applies_to_pools_without_their_own_and_tiers_tell_pools_apart() -> Result<(), ConfigError> {
        let config = ServerConfig::from_toml_str(&format!(
            "[defaults]\nisolation = \"gvisor\"\n[[tenants]]\nname = \"a\"\napi_keys = [\"{KEY}\"]\n\
             [[pools]]\nname = \"strong\"\n[[pools]]\nname = \"fast\"\nisolation = \"process\"\n"
        ))?;
        config.validate()?;
        assert_eq!(config.defaults.isolation, Tier::Gvisor);
        assert_eq!(config.pools[0].tier(config.defaults.isolation), Tier::Gvisor);
        assert_eq!(config.pools[1].tier(config.defaults.isolation), Tier::Process);
        assert_eq!(ServerConfig::default().defaults.isolation, Tier::Process);
        let mut same = config.clone();
        same.pools[1].isolation = Some(Tier::Gvisor);
        let message = same.validate().map_err(|e| e.to_string()).err().unwrap_or_default();
        assert!(message.contains("same isolation, template and limits"), "{message}");
        for tier in [Tier::Microvm, Tier::Auto] {
            let mut bad = config.clone();
            bad.defaults.isolation = tier;
            let message = bad.validate().map_err(|e| e.to_string()).err().unwrap_or_default();
            assert!(message.starts_with(&format!("[defaults] isolation = \"{tier}\"")), "{message}");
            let mut bad = config.clone();
            bad.pools[1].isolation = Some(tier);
            assert!(matches!(bad.validate(), Err(ConfigError::Pool { .. })), "{tier}");
        }
        let message = ServerConfig::from_toml_str("[defaults]\nisolation = \"vm\"\n").err().map(|e| e.to_string());
        assert!(message.as_deref().unwrap_or_default().contains("gvisor"), "{message:?}");
        Ok(())
    }

    #[test]
    fn unknown_fields_are_refused() {
        assert!(ServerConfig::from_toml_str("lisen = \"127.0.0.1:1\"").is_err());
    }

    #[test]
    fn env_keys_add_tenants_with_default_quotas() {
        let mut config = ServerConfig::default();
        assert!(config.add_env_keys(&format!("a:{KEY}1, b:{KEY}2,")).is_ok());
        assert_eq!(config.tenants.len(), 2);
        assert_eq!(config.tenants[1].name, "b");
        assert_eq!(config.tenants[1].max_sandboxes, 32);
        assert!(config.validate().is_ok());
        assert!(matches!(config.add_env_keys("nokey"), Err(ConfigError::EnvEntry(1))));
    }

    #[test]
    fn insecure_no_auth_requires_loopback() {
        let mut config = ServerConfig { insecure_no_auth: true, ..ServerConfig::default() };
        assert!(config.validate().is_ok());
        config.listen = "[::1]:8080".into();
        assert!(config.validate().is_ok());
        config.listen = "0.0.0.0:8080".into();
        let message = config.validate().map_err(|e| e.to_string()).err().unwrap_or_default();
        assert!(message.contains("loopback"), "{message}");
    }

    #[test]
    fn no_keys_without_insecure_is_refused() {
        assert!(matches!(ServerConfig::default().validate(), Err(ConfigError::NoKeys)));
        assert!(with_key().validate().is_ok());
    }

    #[test]
    fn weak_or_duplicate_keys_are_refused_without_showing_them() {
        let mut config = ServerConfig::default();
        assert!(config.add_env_keys("acme:short").is_ok());
        let message = config.validate().map_err(|e| e.to_string()).err().unwrap_or_default();
        assert!(message.contains("acme") && !message.contains("short"), "{message}");
        let mut config = with_key();
        assert!(config.add_env_keys(&format!("other:{KEY}")).is_ok());
        let message = config.validate().map_err(|e| e.to_string()).err().unwrap_or_default();
        assert!(message.contains("more than once") && !message.contains(KEY), "{message}");
    }

    #[test]
    fn debug_output_redacts_keys() {
        assert!(!format!("{:?}", with_key()).contains(KEY));
    }

    #[test]
    fn bad_listen_and_timeouts_say_what_to_fix() {
        let config = ServerConfig { listen: "localhost".into(), ..with_key() };
        assert!(matches!(config.validate(), Err(ConfigError::Listen(_))));
        let config = ServerConfig { default_timeout_s: 10, max_timeout_s: 5, ..with_key() };
        assert!(matches!(config.validate(), Err(ConfigError::Timeouts { .. })));
        let config = ServerConfig { tenants: vec![TenantConfig::new("bad name")], ..with_key() };
        assert!(matches!(config.validate(), Err(ConfigError::TenantName(_))));
    }
}
