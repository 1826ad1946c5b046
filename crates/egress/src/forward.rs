//! Plain HTTP forwarding: a request in absolute form (`GET http://host/path`) is decided on, sent to the
//! checked address over a fresh connection with `Connection: close`, and the response streamed back. The
//! client's connection to the proxy stays keep-alive; every request gets its own decision and audit event.

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::decide::decide_and_connect;
use crate::proxy::Ctx;
use crate::response::{Body, text};
use crate::secrets::Transport;
use crate::upstream;

pub(crate) async fn handle_http(ctx: Ctx, req: Request<Incoming>) -> Response<Body> {
    match req.uri().scheme_str() {
        Some("http") => {}
        Some(other) => {
            let msg = format!("sandkasten egress: {other}:// URLs go through CONNECT, not plain forwarding\n");
            return text(StatusCode::BAD_REQUEST, msg);
        }
        None => {
            let msg = "sandkasten egress: this is a proxy: send requests in absolute form (GET http://host/path)\n";
            return text(StatusCode::BAD_REQUEST, msg.to_owned());
        }
    }
    let Some(authority) = req.uri().authority().cloned() else {
        return text(StatusCode::BAD_REQUEST, "sandkasten egress: the URL has no host\n".to_owned());
    };
    let port = authority.port_u16().unwrap_or(80);
    let go = match decide_and_connect(&ctx, "http", authority.host(), port).await {
        Ok(go) => go,
        Err(resp) => return resp,
    };
    let (mut parts, body) = req.into_parts();
    if let Err(resp) = upstream::prepare(&ctx, &mut parts, &go.host, go.port, Transport::Plain) {
        return *resp;
    }
    let req = Request::from_parts(parts, body);
    upstream::send(&ctx, go.upstream, req, go.counters, Some(go.guard)).await
}
