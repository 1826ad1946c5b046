//! The auditing egress proxy (issue #5): the only way out of a sandbox's network namespace.
//!
//! Each sandbox's namespace has only `lo`. The server binds a listener at `127.0.0.1:3128` inside that
//! namespace and hands it to [`Proxy::serve`]; the proxy runs in the host process, so every connection it
//! makes leaves from the host's network, after a decision. Sandboxes reach it through
//! `sandkasten_types::proxy_environment` (`HTTP_PROXY`, `HTTPS_PROXY`, ...). It speaks HTTP CONNECT and plain
//! HTTP forwarding (absolute-form requests); SOCKS5 is not offered.
//!
//! # Using it
//! ```no_run
//! # async fn f(listener: tokio::net::TcpListener, sink: std::sync::Arc<dyn sandkasten_egress::AuditSink>)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use sandkasten_egress::*;
//! let proxy = Proxy::new(EgressConfig::default(), sink)?;           // once per server
//! let policy = Policy::compile(Mode::Allowlist, &["api.example.com".into()], &[])?;
//! let ca = SandboxCa::generate("sb-1", &["api.example.com".into()])?; // install ca.cert_pem() in the sandbox
//! let sandbox = Arc::new(SandboxEgress::new("sb-1", "tenant-a", policy, Some(ca)));
//! let handle = proxy.serve(listener, sandbox.clone());               // drop or shutdown() to stop
//! sandbox.set_policy(Policy::none());                                 // live change
//! handle.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! # Decisions
//! **Canonicalise, then match, then resolve, then check every address.** A host is first brought to one
//! spelling ([`canonicalize_host`]: lowercase, one trailing dot dropped, `inet_aton` IPv4 forms such as
//! `0x7f.1` or `2130706433`, IPv6 with zone ids, mapped/compatible/NAT64 forms unmapped), so neither the policy
//! nor the range check can be dodged by spelling. The policy matches names, not addresses, but a name proves
//! nothing about where it points: so the proxy resolves it itself (static `[egress.hosts]` first, then the
//! system resolver) and refuses if *any* returned address is in a special range (loopback, private,
//! link-local incl. 169.254.169.254, CGNAT, ULA, multicast, reserved, documentation, benchmarking, and the
//! IPv6 forms embedding those; see [`special_range`]) unless the operator lists it in `allow_cidrs`. Any address
//! of the proxy's own host (public ones too: asked of the kernel's routes) is refused as well unless
//! `allow_cidrs` names exactly that address, since a connection there reaches the host's own services.
//!
//! **Connect to exactly the checked address.** The connection goes to an address from the checked answer,
//! never to a name, so there is no second lookup a rebinding DNS server could answer differently. Mode `open`
//! therefore means "any public destination", never the host's own loopback or the cloud metadata service.
//!
//! **Patterns.** `api.example.com` matches that name only; `*.example.org` matches subdomains, not the apex;
//! `:port` restricts a pattern to one port and without it a pattern matches every port (the name is the
//! trust decision; add `:443` to narrow it). IP literals are accepted as patterns and match that exact address
//! in any spelling; name patterns never match IP literals. Deny wins over allow in every mode. Giving allow
//! patterns with mode `none` or `open` is an error rather than silently ignored. Policy changes apply to
//! requests and tunnels that start afterwards, and to every request inside an intercepted tunnel (each makes
//! a new upstream connection); a blind tunnel keeps the decision it got.
//!
//! **Refusals are answered, and everything is audited.** A refusal is an HTTP 403 (400 for a malformed
//! host) whose text body names the rule, e.g. `sandkasten egress: refused api.evil.test:443: not in the
//! allowlist`; an unreachable upstream is a 502. Each attempt is audited ([`AuditEvent`]): refusals at once,
//! resolution or connect failures as [`Decision::Failed`], and an allowed connection twice under one
//! `connection` number — when it opens (`open`) and when it ends, with bytes up/down — so a long tunnel is visible
//! while it lasts.
//!
//! **Blind tunnels unless a secret needs the request.** A CONNECT is spliced byte for byte: the proxy has
//! decided on the destination, and looking inside TLS would add risk (a CA the sandbox trusts) and cost for
//! nothing. The client's opening is judged first, though (`blind.rs`): a TLS ClientHello must name the CONNECT host
//! as its server name (a shared front end would otherwise route an allowed name's tunnel to another site), one
//! without a server name passes only toward an IP address, and port 443 carries TLS only; a refusal closes the
//! tunnel and its audit record ends as refused with the reason (`sni_mismatch: ...`). Only when a [`Secret`] applies
//! to the CONNECT host and the sandbox's CA may vouch for it does the proxy intercept, because substituting a header
//! inside TLS is impossible otherwise. Substitution is in header values only (never bodies, URLs, or the `Host` the
//! proxy writes: a placeholder is a valid DNS label, and servers reflect `Host`), only toward the secret's hosts (a
//! placeholder sent anywhere else leaves unchanged, so the real value never goes there), and over TLS only: plain
//! HTTP carries a value only to a port a pattern of the secret names (`api.example.com:8080`; never 443).
//!
//! **Interception uses a per-sandbox CA.** [`SandboxCa`] is generated for one sandbox, its key stays in the
//! host process, and its leaves (cached per host) are only served on that sandbox's listener: a CA leaked
//! from one sandbox lets nobody impersonate hosts to another sandbox or to the host. It carries name constraints
//! (the secrets' hosts as the sandbox was created), so a standard verifier accepts its leaves for those hosts only,
//! and it is short-lived ([`CA_VALIDITY`], leaves [`LEAF_VALIDITY`]). Inside an intercepted
//! tunnel each request goes over verified TLS (system roots plus `upstream_ca_file`) to the address checked
//! at CONNECT time, with `Host` forced to the CONNECT host, so a forged inner `Host` cannot redirect a
//! secret. Each inner request uses its own upstream connection (simple and correct; slower for chatty
//! clients).
//!
//! A secret's hosts are trusted with it: a host that reflects request headers back (an echo service) hands
//! the real value to the sandbox. Responses are not scrubbed; list only hosts that consume the secret.
//!
//! **Limits.** Request heads are capped at [`MAX_HEAD_BYTES`] (hyper answers 431 past it) and must arrive
//! within [`HEADER_READ_TIMEOUT`]; a head that would outgrow [`MAX_HEAD_BYTES`] once secrets are substituted
//! (a value is longer than its placeholder) is answered 431 and never built; connects and name resolution are
//! bounded by `connect_timeout_ms`, and so is the wait for a blind tunnel's ClientHello (at most 16 KiB of it is
//! buffered), and system lookups in flight are capped (8 per sandbox, 64 in all; a lookup
//! that timed out keeps its place until its thread is free); a connection or tunnel with no traffic for
//! `idle_timeout_ms` is closed; a sandbox holds at most `max_connections` client connections (tunnels
//! included), further ones wait in the listen backlog, so one sandbox cannot exhaust the host's descriptors.
//! Upstream requests carry `Connection: close`; the client side stays keep-alive and every request on it is
//! decided and audited separately. Bytes that do not parse as HTTP get hyper's 400 and are not audited (they
//! name no destination).
//!
//! **Lifetime.** [`ProxyHandle`] owns the accept loop and every task it spawned: dropping it closes the
//! listener and every open connection and tunnel of that sandbox; [`ProxyHandle::shutdown`] also waits.
#![deny(unsafe_code)]

mod audit;
mod blind;
mod ca;
mod config;
mod decide;
mod entrance;
mod forward;
mod hello;
mod host;
mod intercept;
mod io;
mod local;
mod policy;
mod proxy;
mod ranges;
mod resolve;
mod response;
mod sandbox;
mod secrets;
mod tls;
mod tunnel;
mod upstream;

pub use audit::{AuditEvent, AuditSink, Decision};
pub use ca::{CA_VALIDITY, CaError, LEAF_VALIDITY, SandboxCa};
pub use config::{
    ConfigError, DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_IDLE_TIMEOUT_MS, DEFAULT_MAX_CONNECTIONS, EgressConfig,
    ValidatedConfig,
};
pub use entrance::Entrance;
pub use host::{Host, HostError, canonicalize_host, unmap};
pub use io::Traffic;
pub use policy::{Mode, Pattern, Policy, PolicyError};
pub use proxy::{HEADER_READ_TIMEOUT, MAX_HEAD_BYTES, Proxy, ProxyHandle};
pub use ranges::special_range;
pub use sandbox::SandboxEgress;
pub use secrets::{Secret, SecretError, check_secret_hosts};
