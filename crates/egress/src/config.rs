//! The operator's `[egress]` configuration: static resolver entries, special-range CIDRs the operator
//! explicitly allows, extra upstream TLS roots and timeouts.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::host::{Host, canonicalize_host};

/// Default upstream connect timeout: 10 s.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 10_000;
/// Default idle timeout for a connection or tunnel with no bytes either way: 5 min.
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 300_000;
/// Default cap on one sandbox's concurrent client connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// Default cap on the concurrent client connections of all sandboxes together.
pub const DEFAULT_MAX_TOTAL_CONNECTIONS: usize = 4096;
/// Default cap on the concurrent client connections of one tenant's sandboxes together.
pub const DEFAULT_MAX_TENANT_CONNECTIONS: usize = 1024;

/// The server config file's `[egress]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct EgressConfig {
    /// Static resolver entries consulted before the system resolver, e.g. `"allowed.test" = ["10.200.1.2"]`.
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
    /// Special-range CIDRs (private, loopback, ...) the operator allows, e.g. `"10.200.1.0/24"`. A bare address
    /// means that single address. An address of the proxy's own host is reachable only through an entry naming
    /// exactly it (`/32`, `/128` or bare): a range that merely contains the host does not open its services.
    pub allow_cidrs: Vec<String>,
    /// Extra PEM roots trusted for upstream TLS when intercepting, besides the system roots.
    pub upstream_ca_file: Option<PathBuf>,
    /// Upstream connect (and name resolution) timeout, milliseconds. Default 10 000.
    pub connect_timeout_ms: u64,
    /// A connection or tunnel with no traffic either way for this long is closed, milliseconds. Default 300 000.
    pub idle_timeout_ms: u64,
    /// Concurrent client connections per sandbox (a CONNECT tunnel counts until it closes); more wait in the
    /// listen backlog, so one sandbox cannot exhaust the host's descriptors. Default 256.
    pub max_connections: usize,
    /// Concurrent client connections of all sandboxes together; more wait in their sandbox's backlog, so a few
    /// sandboxes cannot exhaust the server's descriptors (each connection holds at most two: the client's and the
    /// upstream's, which the server reserves at start). Default 4096.
    pub max_total_connections: usize,
    /// Concurrent client connections of one tenant's sandboxes together, so one tenant cannot take every slot of
    /// `max_total_connections`. Default 1024.
    pub max_tenant_connections: usize,
}

impl Default for EgressConfig {
    fn default() -> Self {
        EgressConfig {
            hosts: BTreeMap::new(),
            allow_cidrs: Vec::new(),
            upstream_ca_file: None,
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            idle_timeout_ms: DEFAULT_IDLE_TIMEOUT_MS,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_total_connections: DEFAULT_MAX_TOTAL_CONNECTIONS,
            max_tenant_connections: DEFAULT_MAX_TENANT_CONNECTIONS,
        }
    }
}

/// What is wrong with an `[egress]` table; [`ConfigError::key`] names the offending entry.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A `hosts` key that is not a valid host name.
    #[error("invalid host name {name:?}: {reason}")]
    BadHostName {
        /// The key as written.
        name: String,
        /// Why it is invalid.
        reason: String,
    },
    /// A `hosts` entry with no addresses.
    #[error("{0:?} has no addresses: give at least one, e.g. [\"10.200.1.2\"]")]
    NoAddresses(String),
    /// An `allow_cidrs` entry that does not parse.
    #[error("invalid CIDR {1:?}: write an address with a prefix length, e.g. \"10.200.1.0/24\"")]
    BadCidr(usize, String),
    /// A zero timeout or limit.
    #[error("must be greater than 0")]
    Zero(&'static str),
    /// The TLS client configuration for upstreams could not be built.
    #[error("upstream tls configuration failed: {0}")]
    Tls(String),
    /// The upstream CA file could not be read.
    #[error("{path:?}: {reason}")]
    UpstreamCa {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

impl ConfigError {
    /// The key of the `[egress]` table the problem is in, as a path below it (`hosts."name"`, `allow_cidrs[2]`,
    /// `idle_timeout_ms`).
    pub fn key(&self) -> String {
        match self {
            ConfigError::BadHostName { name, .. } | ConfigError::NoAddresses(name) => format!("hosts.{name:?}"),
            ConfigError::BadCidr(index, _) => format!("allow_cidrs[{index}]"),
            ConfigError::Zero(field) => (*field).to_owned(),
            ConfigError::Tls(_) | ConfigError::UpstreamCa { .. } => "upstream_ca_file".to_owned(),
        }
    }
}

/// A checked configuration, ready for the resolver.
#[derive(Debug, Clone)]
pub struct ValidatedConfig {
    pub(crate) hosts: HashMap<String, Vec<IpAddr>>,
    pub(crate) allow_cidrs: Vec<IpNet>,
    pub(crate) connect_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) max_connections: usize,
    pub(crate) max_total_connections: usize,
    pub(crate) max_tenant_connections: usize,
}

impl EgressConfig {
    /// Checks every entry; the error is the first of [`EgressConfig::problems`]. (The upstream CA file is read by
    /// `Proxy::new`.)
    pub fn validate(&self) -> Result<ValidatedConfig, ConfigError> {
        if let Some(first) = self.problems().into_iter().next() {
            return Err(first);
        }
        let mut hosts = HashMap::new();
        for (name, addrs) in &self.hosts {
            if let Ok(Host::Name(canonical)) = canonicalize_host(name) {
                hosts.insert(canonical, addrs.clone());
            }
        }
        let allow_cidrs = self.allow_cidrs.iter().filter_map(|c| parse_cidr(c)).collect();
        Ok(ValidatedConfig {
            hosts,
            allow_cidrs,
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            idle_timeout: Duration::from_millis(self.idle_timeout_ms),
            max_connections: self.max_connections,
            max_total_connections: self.max_total_connections,
            max_tenant_connections: self.max_tenant_connections,
        })
    }

    /// Every problem of the table, in the order of its keys.
    pub fn problems(&self) -> Vec<ConfigError> {
        let mut problems = Vec::new();
        for (name, addrs) in &self.hosts {
            match canonicalize_host(name) {
                Ok(Host::Name(_)) => {}
                Ok(Host::Ip(_)) => problems.push(ConfigError::BadHostName {
                    name: name.clone(),
                    reason: "an IP address needs no resolver entry".into(),
                }),
                Err(e) => problems.push(ConfigError::BadHostName { name: name.clone(), reason: e.to_string() }),
            }
            if addrs.is_empty() {
                problems.push(ConfigError::NoAddresses(name.clone()));
            }
        }
        for (index, cidr) in self.allow_cidrs.iter().enumerate() {
            if parse_cidr(cidr).is_none() {
                problems.push(ConfigError::BadCidr(index, cidr.clone()));
            }
        }
        for (name, zero) in [
            ("connect_timeout_ms", self.connect_timeout_ms == 0),
            ("idle_timeout_ms", self.idle_timeout_ms == 0),
            ("max_connections", self.max_connections == 0),
            ("max_total_connections", self.max_total_connections == 0),
            ("max_tenant_connections", self.max_tenant_connections == 0),
        ] {
            if zero {
                problems.push(ConfigError::Zero(name));
            }
        }
        problems
    }
}

fn parse_cidr(text: &str) -> Option<IpNet> {
    let trimmed = text.trim();
    if let Ok(net) = trimmed.parse::<IpNet>() {
        return Some(net.trunc());
    }
    trimmed.parse::<IpAddr>().map(IpNet::from).ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn parses_from_toml_with_defaults() {
        let cfg: EgressConfig = toml::from_str(
            r#"
            allow_cidrs = ["10.200.1.0/24", "127.0.0.1"]
            [hosts]
            "Allowed.Test." = ["10.200.1.2"]
            "#,
        )
        .unwrap();
        assert_eq!(cfg.connect_timeout_ms, DEFAULT_CONNECT_TIMEOUT_MS);
        let v = cfg.validate().unwrap();
        assert_eq!(v.hosts["allowed.test"], vec!["10.200.1.2".parse::<IpAddr>().unwrap()]);
        assert_eq!(v.allow_cidrs.len(), 2);
    }

    #[test]
    fn unknown_fields_are_rejected() {
        assert!(toml::from_str::<EgressConfig>("allow_cidr = []").is_err());
    }

    #[test]
    fn bad_entries_are_named() {
        let mut cfg = EgressConfig { allow_cidrs: vec!["10.0.0.0/33".into()], ..Default::default() };
        assert!(cfg.validate().unwrap_err().to_string().contains("10.0.0.0/33"));
        cfg.allow_cidrs.clear();
        cfg.hosts.insert("bad host".into(), vec!["10.0.0.1".parse().unwrap()]);
        assert!(cfg.validate().unwrap_err().to_string().contains("bad host"));
        cfg.hosts.clear();
        cfg.hosts.insert("empty.test".into(), vec![]);
        assert!(cfg.validate().unwrap_err().to_string().contains("empty.test"));
        cfg.hosts.clear();
        cfg.idle_timeout_ms = 0;
        assert_eq!(cfg.validate().unwrap_err().key(), "idle_timeout_ms");
    }

    #[test]
    fn every_problem_is_reported_with_its_key() {
        let mut cfg = EgressConfig { allow_cidrs: vec!["10.0.0.0/8".into(), "nope".into()], ..Default::default() };
        cfg.hosts.insert("bad host".into(), vec![]);
        cfg.max_connections = 0;
        let keys: Vec<String> = cfg.problems().iter().map(ConfigError::key).collect();
        assert_eq!(keys, ["hosts.\"bad host\"", "hosts.\"bad host\"", "allow_cidrs[1]", "max_connections"]);
    }
}
