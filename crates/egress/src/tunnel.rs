//! CONNECT: decide, connect, answer 200, then either hand the tunnel to TLS interception (a secret applies and the
//! sandbox's CA may vouch for the host) or keep it blind (`blind.rs`: the opening is judged, then bytes are spliced).

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use crate::decide::decide_and_connect;
use crate::proxy::Ctx;
use crate::response::{Body, empty, text};
use crate::{blind, intercept, secrets};

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
    let intercept = ctx.sandbox.ca().is_some_and(|ca| ca.permits(&go.host))
        && secrets::any_for(&ctx.sandbox.secrets(), &go.host, port);
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
            blind::run(task_ctx, TokioIo::new(upgraded), go).await;
        }
    });
    empty(StatusCode::OK)
}
