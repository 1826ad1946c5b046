//! The server's own service settings: `[http]` (connections), `[metrics]` (the Prometheus endpoint and usage
//! samples) and `[retention]` (what the database keeps of ended things), with their checks.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::problem::Found;

/// What the database keeps of ended sandboxes, commands and egress events (`[retention]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
    /// Records what is wrong with these values.
    pub(crate) fn check(&self, found: &mut Found) {
        let HttpConfig { header_read_timeout_ms, max_connections, max_connections_per_client } = *self;
        if !(100..=600_000).contains(&header_read_timeout_ms) {
            found.add("http.header_read_timeout_ms", format!("must be 100 to 600000, got {header_read_timeout_ms}"));
        }
        if !(1..=1 << 20).contains(&max_connections) {
            found.add("http.max_connections", format!("must be 1 to 1048576, got {max_connections}"));
        }
        if !(1..=max_connections.max(1)).contains(&max_connections_per_client) {
            found.add(
                "http.max_connections_per_client",
                format!("must be 1 to max_connections ({max_connections}), got {max_connections_per_client}"),
            );
        }
    }
}

/// The Prometheus endpoint `GET /metrics`, and the per-sandbox usage samples of `GET /v1/sandboxes/{id}/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
    /// Records what is wrong with these settings.
    pub(crate) fn check(&self, found: &mut Found) {
        if !(1..=3600).contains(&self.sample_interval_s) {
            found
                .add("metrics.sample_interval_s", format!("must be 1 to 3600 seconds, got {}", self.sample_interval_s));
        }
        if !(1..=100_000).contains(&self.samples_kept) {
            found.add("metrics.samples_kept", format!("must be 1 to 100000, got {}", self.samples_kept));
        }
    }
}

impl RetentionConfig {
    /// Records what is wrong with these settings.
    pub(crate) fn check(&self, found: &mut Found) {
        if !(1..=3650).contains(&self.days) {
            found.add("retention.days", format!("must be 1 to 3650, got {}", self.days));
        }
        if self.max_ended_sandboxes == 0 {
            found.add("retention.max_ended_sandboxes", "must be at least 1, got 0");
        }
    }
}
