//! The server's configuration: a TOML file (`sandkasten serve --config sandkasten.toml`) plus API keys from the
//! environment (`SANDKASTEN_API_KEYS="tenant:key,tenant2:key2"`), validated as a whole before anything starts: every
//! problem is reported with its key path (and line and column), by `sandkasten serve` and `sandkasten config check`
//! alike. The file's JSON schema, generated from these types, is `docs/config.schema.json` (see docs/config.md).
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
//! isolation = "gvisor"                            # tier of creates naming none: "process" (default), "gvisor", "microvm"
//!
//! [[tenants]]
//! name = "acme"
//! api_keys = ["a-long-random-key-of-16-bytes-or-more"]
//! max_sandboxes = 32                              # running at once
//! max_memory_bytes = 8589934592                   # sum of the running sandboxes' memory limits
//! max_pids = 8192                                 # sum of the running sandboxes' pids limits
//! max_output_bytes = 268435456                    # command output the server holds for all its sandboxes at once
//! admin = false                                   # may resize the warm pools, read GET /v1/config
//! scan = { mode = "enforce", python = { allow_imports = ["numpy", "json"] } }  # the tenant's scan policy (below)
//!
//! [[pools]]                                       # warm pool (none by default): sandboxes created ahead of time
//! name = "default"                                # label of the sandkasten_pool_size metric; default "pool-N"
//! isolation = "process"                           # tier of its members; default [defaults] isolation
//! template = "python-data"                        # host (default), e2b, or a template built into [templates] cache
//! limits = { memory_bytes = 268435456 }           # omitted fields take their defaults, as in POST /v1/sandboxes
//! min = 2                                         # ready sandboxes kept (refilled in the background)
//! max = 8                                         # never more than this many, ready or being created
//! zygote = "python"                               # optional: "python" or "node", an interpreter waiting in each member
//! preload = ["json"]                              # modules the zygote imports, besides its template's `preload`
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
//! [microvm]                                       # the microvm tier (scripts/setup-microvm.sh builds its images)
//! dir = "/var/lib/sandkasten/microvm"              # guest kernel, initramfs, root image; agent disks cached here
//! qemu = "qemu-system-x86_64"                      # a path, or a name on PATH
//! accel = "auto"                                   # "auto" (TCG unless set to "kvm"), "kvm" or "tcg"
//! allow_emulation = true                           # false: refuse software emulation
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
mod e2b;
mod effective;
mod file;
mod isolation;
mod mcp;
mod pools;
mod problem;
mod schema;
mod secrets;
mod server;
mod service;
mod snapshots;
mod templates;
mod tenants;

use std::path::Path;

pub use defaults::Defaults;
pub use e2b::E2bConfig;
pub use isolation::{AutoConfig, AutoRule, IsolationConfig, Trust, default_rules};
pub use mcp::McpConfig;
pub use pools::{MAX_POOL_SIZE, MAX_PRELOAD, PoolConfig, ZygoteKind, valid_module_name};
pub use problem::{ConfigError, Problem, Problems};
pub use schema::json_schema;
pub use secrets::SecretsConfig;
pub use server::{API_KEYS_ENV, ServerConfig};
pub use service::{HttpConfig, MetricsConfig, RetentionConfig};
pub use snapshots::SnapshotsConfig;
pub use templates::TemplatesConfig;
pub use tenants::{ApiKey, MAX_KEY_BYTES, MIN_KEY_BYTES, TenantConfig};

impl ServerConfig {
    /// Parses a config file's text (not yet validated): every structural problem (TOML syntax, unknown keys, wrong
    /// types or values), with its line and column.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        file::Parsed::new(text).into_config()
    }

    /// Reads a config file (not yet validated).
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = read(path)?;
        Self::from_toml_str(&text).map_err(|error| in_file(error, path))
    }

    /// The whole configuration as `sandkasten serve` uses it: the file (or defaults), plus the keys of
    /// `SANDKASTEN_API_KEYS`, validated.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with(path, |_| Ok(()))
    }

    /// The file (or defaults), plus the keys of `SANDKASTEN_API_KEYS`, then `adjust` (command-line overrides),
    /// validated: every problem, structural and semantic, each with its key path, and with its line and column when
    /// the key is in the file. What `sandkasten serve` and `sandkasten config check` both run.
    pub fn load_with(
        path: Option<&Path>,
        adjust: impl FnOnce(&mut ServerConfig) -> Result<(), ConfigError>,
    ) -> Result<Self, ConfigError> {
        let text = path.map(read).transpose()?;
        let parsed = file::Parsed::new(text.as_deref().unwrap_or_default());
        let (mut config, mut problems) = parsed.tolerant();
        let mut extra = Vec::new();
        if let Ok(value) = std::env::var(API_KEYS_ENV)
            && let Err(error) = config.add_env_keys(&value)
        {
            extra.extend(error.problems().iter().cloned());
        }
        if let Err(error) = adjust(&mut config) {
            extra.extend(error.problems().iter().cloned());
        }
        extra.extend(config.problems());
        problems.extend(parsed.place(extra));
        file::sort(&mut problems);
        match problems.is_empty() {
            true => Ok(config),
            false => Err(ConfigError::Invalid(Problems { file: path.map(Path::to_owned), problems })),
        }
    }
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })
}

/// The error with the file it is about.
fn in_file(error: ConfigError, path: &Path) -> ConfigError {
    match error {
        ConfigError::Invalid(problems) => ConfigError::Invalid(Problems { file: Some(path.to_owned()), ..problems }),
        other => other,
    }
}
