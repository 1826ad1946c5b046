//! Audit records: one per attempt. Refusals are recorded at once; an allowed connection is recorded when it
//! opens (`open`, no bytes) and again, under the same `connection` number, when it ends, with the bytes that went up
//! and down: a sink that keeps one row per attempt replaces the first record by the second.

use std::net::IpAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// What the proxy did with an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Policy and address check passed and the upstream connection was made.
    Allowed,
    /// Refused by policy, by the address check, or as malformed (the client got a 4xx); or a blind tunnel closed at
    /// its opening (a ClientHello for another host, ...): then the record ends the connection's `open` one.
    Refused,
    /// Allowed by policy, but the name did not resolve or the upstream could not be reached (the client got a
    /// 502).
    Failed,
}

/// One egress attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEvent {
    /// When the attempt started, unix milliseconds.
    pub time_ms: u64,
    /// The sandbox that made it.
    pub sandbox_id: String,
    /// The sandbox's tenant.
    pub tenant: String,
    /// `connect` (CONNECT tunnel) or `http` (plain HTTP forwarding).
    pub scheme: String,
    /// The requested host in canonical form (IPv6 without brackets); as sent if it could not be canonicalised.
    pub host: String,
    /// The requested port.
    pub port: u16,
    /// The address connected to, or the address that caused a refusal; none when refused before resolving.
    pub resolved: Option<IpAddr>,
    /// What happened.
    pub decision: Decision,
    /// The rule that allowed or refused it, human readable (e.g. `allow "*.example.org"`, `not in allowlist`,
    /// `special range link-local, cloud metadata endpoint`).
    pub rule: String,
    /// Bytes sent to the upstream (after TLS for blind tunnels, including TLS when intercepting).
    pub bytes_up: u64,
    /// Bytes received from the upstream.
    pub bytes_down: u64,
    /// For an allowed attempt, its connection's number (unique in this proxy): the attempt is recorded twice with
    /// it, once when the connection opens (`open`, no bytes yet) and once when it ends (with its bytes), so a long
    /// tunnel is visible in the audit while it lasts. `None` for refusals and failures (recorded once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<u64>,
    /// True on the record made when an allowed connection opens; false on every other record.
    #[serde(default)]
    pub open: bool,
}

/// Numbers the allowed connections of every proxy in this process.
static NEXT_CONNECTION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A fresh connection number.
pub(crate) fn next_connection() -> u64 {
    NEXT_CONNECTION.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Where audit events go. Called from the proxy's tasks: must not block for long.
pub trait AuditSink: Send + Sync + 'static {
    /// Records one event.
    fn record(&self, event: AuditEvent);
}

/// Current time in unix milliseconds.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
