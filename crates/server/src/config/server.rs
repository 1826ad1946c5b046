//! `ServerConfig`, the whole config file as one type (its tables are the sibling modules' types), and its semantic
//! checks: every problem at its key path (`ServerConfig::problems`), what `validate` and the file loader report.

use std::net::SocketAddr;
use std::path::PathBuf;

use sandkasten_scan::ScanPolicy;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::defaults::Defaults;
use crate::config::e2b::E2bConfig;
use crate::config::isolation::IsolationConfig;
use crate::config::mcp::McpConfig;
use crate::config::pools::{self, PoolConfig};
use crate::config::problem::{ConfigError, Found, Problem, Problems};
use crate::config::secrets::SecretsConfig;
use crate::config::service::{HttpConfig, MetricsConfig, RetentionConfig};
use crate::config::snapshots::SnapshotsConfig;
use crate::config::templates::TemplatesConfig;
use crate::config::tenants::{self, ApiKey, TenantConfig};

/// Name of the environment variable holding extra API keys.
pub const API_KEYS_ENV: &str = "SANDKASTEN_API_KEYS";

/// Everything `sandkasten serve` needs to know: the config file (`docs/config.schema.json` is its JSON schema).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "sandkasten server config")]
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
    /// How `isolation: "auto"` picks a tier (`[isolation.auto]`: `allow_emulation`, ordered `rules`).
    #[serde(default)]
    pub isolation: IsolationConfig,
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
    /// How the microvm tier runs its VMs: `[microvm] dir = "/var/lib/sandkasten/microvm"` (kernel, initramfs, root
    /// image from scripts/setup-microvm.sh), `qemu`, `accel = "auto" | "kvm" | "tcg"`, `allow_emulation`,
    /// `release_paused` (whether a pause with memory saves the VM and ends its VMM), `kernel_args` (guest kernel
    /// parameters added to the tier's own).
    #[serde(default)]
    pub microvm: sandkasten_types::MicrovmSettings,
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
    /// The E2B facade (`[e2b]`): the domain of sandbox port host names.
    #[serde(default)]
    pub e2b: E2bConfig,
    /// What template builds may reach (`[templates]`): the registries, unless read from the host's clients.
    #[serde(default)]
    pub templates: TemplatesConfig,
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
            isolation: IsolationConfig::default(),
            tenants: Vec::new(),
            pools: Vec::new(),
            metrics: MetricsConfig::default(),
            http: HttpConfig::default(),
            retention: RetentionConfig::default(),
            egress: sandkasten_egress::EgressConfig::default(),
            gvisor: sandkasten_types::GvisorSettings::default(),
            microvm: sandkasten_types::MicrovmSettings::default(),
            secrets: SecretsConfig::default(),
            snapshots: SnapshotsConfig::default(),
            scan: ScanPolicy::default(),
            mcp: McpConfig::default(),
            e2b: E2bConfig::default(),
            templates: TemplatesConfig::default(),
        }
    }
}

/// Longest accepted sandbox lifetime a config may allow: one week.
const MAX_CONFIGURABLE_TIMEOUT_S: u64 = 7 * 24 * 3600;

impl ServerConfig {
    /// Adds the keys of a `SANDKASTEN_API_KEYS` value (`tenant:key,tenant2:key2`); a tenant not in the file gets the
    /// default quotas.
    pub fn add_env_keys(&mut self, value: &str) -> Result<(), ConfigError> {
        for (index, entry) in value.split(',').map(str::trim).enumerate() {
            if entry.is_empty() {
                continue;
            }
            let bad =
                || ConfigError::at(API_KEYS_ENV, format!("entry number {} is not of the form tenant:key", index + 1));
            let (tenant, key) = entry.split_once(':').ok_or_else(bad)?;
            if tenant.is_empty() || key.is_empty() {
                return Err(bad());
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
        self.listen.parse().map_err(|_| ConfigError::at("listen", listen_problem(&self.listen)))
    }

    /// Checks the whole configuration: every problem, each at its key path.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let problems = self.problems();
        match problems.is_empty() {
            true => Ok(()),
            false => Err(ConfigError::Invalid(Problems::new(problems))),
        }
    }

    /// Every problem of the configuration (what [`ServerConfig::validate`] reports), in the order of the keys.
    pub fn problems(&self) -> Vec<Problem> {
        let mut found = Found::default();
        match self.listen.parse::<SocketAddr>() {
            Err(_) => found.add("listen", listen_problem(&self.listen)),
            Ok(addr) if self.insecure_no_auth && !addr.ip().is_loopback() => found.add(
                "insecure_no_auth",
                format!(
                    "only allowed when listening on a loopback address (127.0.0.1 or ::1), not {addr}: configure API \
                     keys instead"
                ),
            ),
            Ok(_) => {}
        }
        let (default, max) = (self.default_timeout_s, self.max_timeout_s);
        if max > MAX_CONFIGURABLE_TIMEOUT_S {
            found.add("max_timeout_s", format!("must be at most {MAX_CONFIGURABLE_TIMEOUT_S} (a week), got {max}"));
        }
        if !(1..=max.max(1)).contains(&default) {
            found.add("default_timeout_s", format!("must be 1 to max_timeout_s ({max}), got {default}"));
        }
        for (name, got, max) in [
            ("max_file_bytes", self.max_file_bytes, 1 << 40),
            ("max_json_bytes", self.max_json_bytes, 1 << 30),
            ("max_retained_output_bytes", self.max_retained_output_bytes, 1 << 40),
        ] {
            if !(1..=max).contains(&got) {
                found.add(name, format!("must be between 1 and {max} bytes, got {got}"));
            }
        }
        if let Some(got) = self.max_pids
            && !(1..=sandkasten_types::MAX_PIDS).contains(&got)
        {
            found.add("max_pids", format!("must be 1 to {}, got {got}", sandkasten_types::MAX_PIDS));
        }
        if let Some(reason) = self.defaults.isolation.unavailable_reason() {
            found.add("defaults.isolation", reason);
        }
        let any_key = tenants::check(&self.tenants, &mut found);
        if !self.insecure_no_auth && !any_key {
            found.add(
                "tenants",
                format!(
                    "no API keys: add [[tenants]] with api_keys to the config file or set {API_KEYS_ENV}=\"tenant:key\" \
                     (or insecure_no_auth = true on a loopback address, for local use only)"
                ),
            );
        }
        self.isolation.auto.check(&mut found);
        pools::check(&self.pools, self.defaults.isolation, &mut found);
        for problem in self.egress.problems() {
            found.add(format!("egress.{}", problem.key()), problem);
        }
        self.http.check(&mut found);
        self.metrics.check(&mut found);
        self.retention.check(&mut found);
        self.secrets.check(&mut found);
        tenants::check_scan(&self.scan, "scan", &mut found);
        self.mcp.check(&mut found);
        self.templates.check(&mut found);
        self.e2b.check(&mut found);
        found.check("microvm.kernel_args", self.microvm.kernel_args_problem());
        found.0
    }
}

fn listen_problem(listen: &str) -> String {
    format!("{listen:?} is not an address with a port, e.g. \"127.0.0.1:8080\" or \"[::1]:8080\"")
}

#[cfg(test)]
mod tests {
    use sandkasten_types::{Limits, Tier};

    use super::*;
    use crate::config::{MAX_POOL_SIZE, MAX_PRELOAD, ZygoteKind};

    const KEY: &str = "0123456789abcdef-key";

    /// The paths of the problems `validate` reports.
    fn paths(config: &ServerConfig) -> Vec<String> {
        config.validate().err().iter().flat_map(|e| e.problems()).map(|p| p.path.clone()).collect()
    }

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
        assert_eq!(paths(&bad), ["tenants[0].scan.python.deny_imports"]);
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
        assert_eq!(paths(&bad), ["pools[0].min"]);
        let mut bad = config.clone();
        bad.pools[1].limits = bad.pools[0].limits.clone();
        assert_eq!(paths(&bad), ["pools[1]"]);
        let mut bad = config;
        bad.pools[0].limits.memory_bytes = 1;
        bad.pools[1].max = MAX_POOL_SIZE + 1;
        assert_eq!(paths(&bad), ["pools[0].limits", "pools[1].max"]);
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
            assert_eq!(paths(&bad), ["pools[0].preload[0]"], "{bad_name:?}");
        }
        let mut bad = config.clone();
        bad.pools[1].preload = vec!["json".into()];
        let message = bad.validate().map_err(|e| e.to_string()).err().unwrap_or_default();
        assert!(message.contains("pools[1].preload: preload needs a zygote"), "{message}");
        let mut bad = config;
        bad.pools[0].preload = vec!["json".into(); MAX_PRELOAD + 1];
        assert_eq!(paths(&bad), ["pools[0].preload"]);
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
        let mut bad = config.clone();
        bad.defaults.isolation = Tier::Auto;
        let message = bad.validate().map_err(|e| e.to_string()).err().unwrap_or_default();
        assert!(message.contains("defaults.isolation: isolation \"auto\" is resolved"), "{message}");
        let mut bad = config.clone();
        bad.pools[1].isolation = Some(Tier::Auto);
        assert_eq!(paths(&bad), ["pools[1].isolation"]);
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
        let error = config.add_env_keys("nokey").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("SANDKASTEN_API_KEYS: entry number 1 is not of the form tenant:key"), "{error}");
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
        assert_eq!(paths(&ServerConfig::default()), ["tenants"]);
        assert!(with_key().validate().is_ok());
    }

    #[test]
    fn weak_or_duplicate_keys_are_refused_without_showing_them() {
        let mut config = ServerConfig::default();
        assert!(config.add_env_keys("acme:short").is_ok());
        let message = config.validate().map_err(|e| e.to_string()).err().unwrap_or_default();
        assert!(message.contains("tenants[0].api_keys[0]") && !message.contains("short"), "{message}");
        let mut config = with_key();
        assert!(config.add_env_keys(&format!("other:{KEY}")).is_ok());
        let message = config.validate().map_err(|e| e.to_string()).err().unwrap_or_default();
        assert!(message.contains("more than once") && !message.contains(KEY), "{message}");
    }

    #[test]
    fn a_guest_kernel_parameter_that_is_not_one_word_is_refused_at_its_key() {
        let mut config = with_key();
        config.microvm.kernel_args = vec!["sysctl.vm.panic_on_oom=1".into()];
        assert!(paths(&config).is_empty());
        config.microvm.kernel_args.push("init=/bin/sh rw".into());
        assert_eq!(paths(&config), ["microvm.kernel_args"]);
    }

    #[test]
    fn debug_output_redacts_keys() {
        assert!(!format!("{:?}", with_key()).contains(KEY));
    }

    #[test]
    fn bad_listen_and_timeouts_say_what_to_fix() {
        let config = ServerConfig { listen: "localhost".into(), ..with_key() };
        assert_eq!(paths(&config), ["listen"]);
        let config = ServerConfig { default_timeout_s: 10, max_timeout_s: 5, ..with_key() };
        assert_eq!(paths(&config), ["default_timeout_s"]);
        let mut config = with_key();
        config.tenants.push(TenantConfig::new("bad name"));
        assert_eq!(paths(&config), ["tenants[1].name"]);
    }

    #[test]
    fn every_problem_is_reported_not_just_the_first() {
        let mut config = ServerConfig { listen: "nowhere".into(), max_json_bytes: 0, ..with_key() };
        config.http.max_connections = 0;
        config.retention.days = 0;
        config.tenants.push(TenantConfig::new("acme"));
        assert_eq!(
            paths(&config),
            [
                "listen",
                "max_json_bytes",
                "tenants[1].name",
                "http.max_connections",
                "http.max_connections_per_client",
                "retention.days"
            ]
        );
    }
}
