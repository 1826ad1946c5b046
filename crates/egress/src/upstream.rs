//! Sending one request to an upstream over an already checked connection (plain TCP or TLS) and preparing
//! the request: origin-form URI, `Host` forced to the checked destination, hop-by-hop headers removed,
//! secrets substituted, `Connection: close`.

use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::request::Parts;
use http::uri::PathAndQuery;
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::decide::AuditGuard;
use crate::host::Host;
use crate::io::{Counters, idle_watchdog};
use crate::proxy::{Ctx, MAX_HEAD_BYTES};
use crate::response::{Body, strip_hop_by_hop, text};
use crate::secrets::{self, Transport};

/// Rewrites a request head for the upstream `host:port`, reached over `transport` (which decides the secrets it may
/// carry); a 431 for the client when substituting secrets would make the head larger than [`MAX_HEAD_BYTES`].
pub(crate) fn prepare(
    ctx: &Ctx,
    parts: &mut Parts,
    host: &Host,
    port: u16,
    transport: Transport,
) -> Result<(), Box<Response<Body>>> {
    let path = parts.uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
    parts.uri = Uri::from(path);
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    // The client's Host goes (it names nothing: the destination is decided); the proxy writes its own after the
    // substitution, so a placeholder in the host name (a valid DNS label) never becomes the value there.
    parts.headers.remove(header::HOST);
    let changed = secrets::substitute(
        &ctx.sandbox.secrets(),
        host,
        port,
        transport,
        &mut parts.headers,
        MAX_HEAD_BYTES,
    )
    .map_err(|_| {
        let msg = format!(
            "sandkasten egress: the request head would exceed {MAX_HEAD_BYTES} bytes once secrets are substituted\n"
        );
        Box::new(text(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, msg))
    })?;
    let authority = if port == transport.default_port() { host.to_string() } else { format!("{host}:{port}") };
    if let Ok(value) = HeaderValue::from_str(&authority) {
        parts.headers.insert(header::HOST, value);
    }
    if changed > 0 {
        tracing::debug!(sandbox = %ctx.sandbox.sandbox_id, host = %host, changed, "egress secrets substituted");
    }
    parts.headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    Ok(())
}

/// Sends `req` over `io` and returns the upstream's response (hop-by-hop headers removed). The connection is
/// driven by a task of the sandbox that ends when the response is done or the connection idles; `guard`, if
/// any, is dropped (recording the audit event) then.
pub(crate) async fn send<T>(
    ctx: &Ctx,
    io: T,
    req: Request<Incoming>,
    counters: Arc<Counters>,
    guard: Option<AuditGuard>,
) -> Response<Body>
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, conn) = match http1::Builder::new().handshake(TokioIo::new(io)).await {
        Ok(pair) => pair,
        Err(e) => {
            return text(StatusCode::BAD_GATEWAY, format!("sandkasten egress: upstream connection failed: {e}\n"));
        }
    };
    let idle = ctx.inner.idle_timeout;
    ctx.tasks.spawn(async move {
        let _guard = guard;
        tokio::select! {
            _ = conn => {}
            _ = idle_watchdog(vec![counters], idle) => {}
        }
    });
    match sender.send_request(req).await {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, body.boxed())
        }
        Err(e) => text(StatusCode::BAD_GATEWAY, format!("sandkasten egress: upstream request failed: {e}\n")),
    }
}
