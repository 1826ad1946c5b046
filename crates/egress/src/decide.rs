//! The decision for one attempt, in order: canonicalise the host, match the policy, resolve, check every
//! address, connect to a checked address. Every refusal or failure is audited here and turned into the
//! client's response; a success is recorded as open at once and carries an audit guard that records it again,
//! with its byte counts, when the connection ends.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use tokio::net::TcpStream;

use crate::audit::{AuditEvent, AuditSink, Decision, next_connection, now_ms};
use crate::host::{Host, canonicalize_host};
use crate::io::{Counters, CountingIo};
use crate::policy::NameVerdict;
use crate::proxy::Ctx;
use crate::resolve::AddrRefusal;
use crate::response::{Body, refusal};

/// A permitted, connected attempt.
pub(crate) struct Go {
    pub(crate) host: Host,
    pub(crate) port: u16,
    /// The checked addresses (for further connections of an intercepted tunnel).
    pub(crate) addrs: Vec<IpAddr>,
    pub(crate) upstream: CountingIo<TcpStream>,
    /// Upstream byte counters (written = up, read = down), shared by every upstream connection of the attempt.
    pub(crate) counters: Arc<Counters>,
    pub(crate) guard: AuditGuard,
}

/// Records the allowed attempt, with the byte counts, when dropped (i.e. when its connection ends, however
/// it ends).
pub(crate) struct AuditGuard {
    event: Option<AuditEvent>,
    counters: Arc<Counters>,
    sink: Arc<dyn AuditSink>,
}

impl AuditGuard {
    /// Makes the record written at the end say the attempt was refused for `rule` (a blind tunnel refused at its
    /// opening, after it was recorded as open).
    pub(crate) fn refuse(&mut self, rule: String) {
        if let Some(event) = &mut self.event {
            event.decision = Decision::Refused;
            event.rule = rule;
        }
    }
}

impl Drop for AuditGuard {
    fn drop(&mut self) {
        if let Some(mut event) = self.event.take() {
            event.bytes_up = self.counters.written();
            event.bytes_down = self.counters.read();
            self.sink.record(event);
        }
    }
}

/// Why an attempt ends before connecting, as the audit and the client see it.
struct Denial {
    decision: Decision,
    status: StatusCode,
    /// `host:port` as the client message writes it.
    target: String,
    rule: String,
    message: String,
}

impl Denial {
    fn refused(status: StatusCode, target: &str, rule: String, message: String) -> Denial {
        Denial { decision: Decision::Refused, status, target: target.to_owned(), rule, message }
    }

    fn failed(target: &str, rule: String, message: String) -> Denial {
        Denial { decision: Decision::Failed, status: StatusCode::BAD_GATEWAY, target: target.to_owned(), rule, message }
    }
}

/// Decides on `raw_host:port` for `scheme` (`connect` or `http`) and connects, or returns the response for the
/// client after auditing the refusal or failure.
pub(crate) async fn decide_and_connect(
    ctx: &Ctx,
    scheme: &str,
    raw_host: &str,
    port: u16,
) -> Result<Go, hyper::Response<Body>> {
    let mut event = AuditEvent {
        time_ms: now_ms(),
        sandbox_id: ctx.sandbox.sandbox_id.clone(),
        tenant: ctx.sandbox.tenant.clone(),
        scheme: scheme.to_owned(),
        host: raw_host.chars().take(255).collect(),
        port,
        resolved: None,
        decision: Decision::Allowed,
        rule: String::new(),
        bytes_up: 0,
        bytes_down: 0,
        connection: None,
        open: false,
    };
    match attempt(ctx, raw_host, port, &mut event).await {
        Ok((host, addrs, stream)) => {
            event.connection = Some(next_connection());
            ctx.inner.audit.record(AuditEvent { open: true, ..event.clone() });
            let counters = Counters::upstream_of(ctx.sandbox.traffic_counters());
            let guard = AuditGuard { event: Some(event), counters: counters.clone(), sink: ctx.inner.audit.clone() };
            let upstream = CountingIo::new(stream, counters.clone());
            Ok(Go { host, port, addrs, upstream, counters, guard })
        }
        Err(denial) => {
            event.decision = denial.decision;
            event.rule = denial.rule;
            ctx.inner.audit.record(event);
            Err(refusal(denial.status, &denial.target, &denial.message))
        }
    }
}

/// Asks the current policy again about a destination already checked and resolved (a new upstream connection
/// inside an intercepted tunnel): the policy may have changed since. A refusal is audited like any other and
/// returned as the response for the client (boxed: it is the rare path).
pub(crate) fn recheck_policy(
    ctx: &Ctx,
    scheme: &str,
    host: &Host,
    port: u16,
) -> Result<(), Box<hyper::Response<Body>>> {
    let NameVerdict::Refused { rule, reason } = ctx.sandbox.policy().check(host, port) else {
        return Ok(());
    };
    ctx.inner.audit.record(AuditEvent {
        time_ms: now_ms(),
        sandbox_id: ctx.sandbox.sandbox_id.clone(),
        tenant: ctx.sandbox.tenant.clone(),
        scheme: scheme.to_owned(),
        host: host.audit_string(),
        port,
        resolved: None,
        decision: Decision::Refused,
        rule,
        bytes_up: 0,
        bytes_down: 0,
        connection: None,
        open: false,
    });
    Err(Box::new(refusal(StatusCode::FORBIDDEN, &format!("{host}:{port}"), &reason)))
}

/// The steps of a decision; fills in the event's canonical host, resolved address and allowing rule.
async fn attempt(
    ctx: &Ctx,
    raw_host: &str,
    port: u16,
    event: &mut AuditEvent,
) -> Result<(Host, Vec<IpAddr>, TcpStream), Denial> {
    let raw_target = format!("{}:{port}", event.host);
    let host = canonicalize_host(raw_host)
        .map_err(|e| Denial::refused(StatusCode::BAD_REQUEST, &raw_target, "invalid host".into(), e.to_string()))?;
    event.host = host.audit_string();
    let target = format!("{host}:{port}");
    if port == 0 {
        return Err(Denial::refused(StatusCode::BAD_REQUEST, &target, "invalid port".into(), "port 0".into()));
    }
    let mut rule = match ctx.sandbox.policy().check(&host, port) {
        NameVerdict::Allowed { rule } => rule,
        NameVerdict::Refused { rule, reason } => {
            return Err(Denial::refused(StatusCode::FORBIDDEN, &target, rule, reason));
        }
    };
    let checked = match ctx.inner.resolver.resolve_checked(&host, port, ctx.sandbox.lookups()).await {
        Ok(checked) => checked,
        Err(AddrRefusal::Unresolvable(why)) => return Err(Denial::failed(&target, format!("{rule}; {why}"), why)),
        Err(AddrRefusal::Special { addr, range }) => {
            event.resolved = Some(addr);
            let message = match host {
                Host::Ip(_) => format!("{addr} is {range}, which is never allowed"),
                Host::Name(_) => format!("resolves to {addr} ({range}) which is never allowed"),
            };
            return Err(Denial::refused(StatusCode::FORBIDDEN, &target, format!("special range {range}"), message));
        }
    };
    if let Some((rule, reason)) = ctx.sandbox.policy().denied_address(&checked.addrs, port) {
        return Err(Denial::refused(StatusCode::FORBIDDEN, &target, rule, reason));
    }
    if let Some(via) = &checked.via_cidr {
        rule = format!("{rule}; {via}");
    }
    match dial(&checked.addrs, port, ctx.inner.connect_timeout).await {
        Ok((stream, addr)) => {
            event.resolved = Some(addr);
            event.rule = rule;
            Ok((host, checked.addrs, stream))
        }
        Err((addr, why)) => {
            event.resolved = addr;
            Err(Denial::failed(&target, format!("{rule}; {why}"), format!("upstream connect failed: {why}")))
        }
    }
}

/// Connects to the first reachable checked address; each try is bounded by `timeout`.
pub(crate) async fn dial(
    addrs: &[IpAddr],
    port: u16,
    timeout: Duration,
) -> Result<(TcpStream, IpAddr), (Option<IpAddr>, String)> {
    let mut last = (None, "no address to connect to".to_owned());
    for &addr in addrs {
        match tokio::time::timeout(timeout, TcpStream::connect(SocketAddr::new(addr, port))).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok((stream, addr));
            }
            Ok(Err(e)) => last = (Some(addr), format!("{addr}:{port}: {e}")),
            Err(_) => last = (Some(addr), format!("{addr}:{port}: timed out")),
        }
    }
    Err(last)
}
