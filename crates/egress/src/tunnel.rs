//! CONNECT: decide, connect, answer 200, then either splice bytes blindly (no secret for this destination)
//! or hand the tunnel to TLS interception (a secret applies and the sandbox has a CA).

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use crate::decide::{Go, decide_and_connect};
use crate::intercept;
use crate::io::idle_watchdog;
use crate::proxy::Ctx;
use crate::response::{Body, empty, text};
use crate::secrets;

pub(crate) async fn handle_connect(ctx: Ctx, req: Request<Incoming>) -> Response<Body> {
    let Some(authority) = req.uri().authority().cloned() else {
        return text(StatusCode::BAD_REQUEST, "sandkasten egress: CONNECT needs host:port\n".to_owned());
    };
    let Some(port) = authority.port_u16() else {
        return text(StatusCode::BAD_REQUEST, "sandkasten egress: CONNECT needs host:port\n".to_owned());
    };
    let go = match decide_and_connect(&ctx, "connect", authority.host(), port).await {
        Ok(go) => go,
        Err(resp) => return resp,
    };
    let intercept = ctx.sandbox.ca().is_some() && secrets::any_for(&ctx.sandbox.secrets(), &go.host, port);
    let on_upgrade = hyper::upgrade::on(req);
    let task_ctx = ctx.clone();
    ctx.tasks.spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(error = %e, "egress CONNECT upgrade failed");
                return;
            }
        };
        if intercept {
            intercept::run(task_ctx, TokioIo::new(upgraded), go).await;
        } else {
            blind(task_ctx, TokioIo::new(upgraded), go).await;
        }
    });
    empty(StatusCode::OK)
}

/// Copy buffer per direction of a blind tunnel: tokio's default (8 KiB) costs about twice the CPU per byte (measured
/// by `examples/egress_bench`).
const TUNNEL_BUFFER: usize = 64 * 1024;

/// Splices the client and upstream until both sides close or the tunnel idles.
async fn blind(ctx: Ctx, mut client: TokioIo<hyper::upgrade::Upgraded>, go: Go) {
    let Go { mut upstream, counters, guard, .. } = go;
    tokio::select! {
        _ = tokio::io::copy_bidirectional_with_sizes(&mut client, &mut upstream, TUNNEL_BUFFER, TUNNEL_BUFFER) => {}
        _ = idle_watchdog(vec![counters], ctx.inner.idle_timeout) => {}
    }
    drop(guard);
}
