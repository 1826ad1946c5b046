//! TLS interception of a CONNECT tunnel for which a secret applies: the sandbox's CA issues a leaf for the
//! CONNECT host, the HTTP/1.1 requests inside are served, secrets substituted in their headers, and each is
//! forwarded over TLS (verified against system roots plus `upstream_ca_file`) to the address checked at
//! CONNECT time, never to whatever the inner `Host` header names. Each request opens a new upstream connection,
//! so each is first checked against the policy in force at that moment.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::upgrade::Upgraded;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::decide::{Go, dial, recheck_policy};
use crate::host::Host;
use crate::io::{Counters, CountingIo, idle_watchdog};
use crate::proxy::{Ctx, HEADER_READ_TIMEOUT, MAX_HEAD_BYTES};
use crate::response::{Body, text};
use crate::secrets::Transport;
use crate::upstream;

/// What every request inside one intercepted tunnel shares.
struct Tunnel {
    ctx: Ctx,
    host: Host,
    port: u16,
    addrs: Vec<std::net::IpAddr>,
    counters: Arc<Counters>,
    /// The connection made at CONNECT time, used by the first request.
    first: Mutex<Option<CountingIo<TcpStream>>>,
}

pub(crate) async fn run(ctx: Ctx, client: TokioIo<Upgraded>, go: Go) {
    let Go { host, port, addrs, upstream, counters, guard } = go;
    let Some(ca) = ctx.sandbox.ca() else { return };
    let server_config = match ca.server_config(&host) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(sandbox = %ctx.sandbox.sandbox_id, error = %e, "egress leaf certificate failed");
            return;
        }
    };
    let client_counters = Counters::new();
    let client = CountingIo::new(client, client_counters.clone());
    let idle = ctx.inner.idle_timeout;
    let tls =
        match tokio::time::timeout(ctx.inner.connect_timeout, TlsAcceptor::from(server_config).accept(client)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                tracing::debug!(sandbox = %ctx.sandbox.sandbox_id, error = %e, "egress interception handshake failed");
                return;
            }
            Err(_) => return,
        };
    let tunnel = Arc::new(Tunnel {
        ctx: ctx.clone(),
        host,
        port,
        addrs,
        counters: counters.clone(),
        first: Mutex::new(Some(upstream)),
    });
    let service = service_fn(move |req| {
        let tunnel = tunnel.clone();
        async move { Ok::<_, Infallible>(forward(tunnel, req).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .max_header_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(tls), service);
    tokio::select! {
        _ = conn => {}
        _ = idle_watchdog(vec![counters.clone(), client_counters], idle) => {}
    }
    drop(guard);
}

async fn forward(tunnel: Arc<Tunnel>, req: Request<Incoming>) -> Response<Body> {
    let ctx = &tunnel.ctx;
    // Each request makes a new upstream connection: it follows the policy in force now, not at CONNECT time.
    if let Err(resp) = recheck_policy(ctx, "connect", &tunnel.host, tunnel.port) {
        return *resp;
    }
    let (mut parts, body) = req.into_parts();
    if let Err(resp) = upstream::prepare(ctx, &mut parts, &tunnel.host, tunnel.port, Transport::Tls) {
        return *resp;
    }
    let tcp = tunnel.first.lock().unwrap_or_else(|e| e.into_inner()).take();
    let tcp = match tcp {
        Some(tcp) => tcp,
        None => match dial(&tunnel.addrs, tunnel.port, ctx.inner.connect_timeout).await {
            Ok((stream, _)) => CountingIo::new(stream, tunnel.counters.clone()),
            Err((_, why)) => {
                return text(StatusCode::BAD_GATEWAY, format!("sandkasten egress: upstream connect failed: {why}\n"));
            }
        },
    };
    let name = match &tunnel.host {
        Host::Name(n) => ServerName::try_from(n.clone()),
        Host::Ip(ip) => Ok(ServerName::IpAddress((*ip).into())),
    };
    let Ok(name) = name else {
        return text(StatusCode::BAD_GATEWAY, format!("sandkasten egress: {} is no TLS server name\n", tunnel.host));
    };
    let connector = TlsConnector::from(ctx.inner.client_tls.clone());
    let tls = match tokio::time::timeout(ctx.inner.connect_timeout, connector.connect(name, tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            let msg = format!("sandkasten egress: upstream TLS with {} failed: {e}\n", tunnel.host);
            return text(StatusCode::BAD_GATEWAY, msg);
        }
        Err(_) => return text(StatusCode::BAD_GATEWAY, "sandkasten egress: upstream TLS timed out\n".to_owned()),
    };
    upstream::send(ctx, tls, Request::from_parts(parts, body), tunnel.counters.clone(), None).await
}
