//! One HTTP request forwarded to a port inside a sandbox, for the native route (`/v1/sandboxes/{id}/ports/{port}/…`)
//! and the facade's host names (`PORT-SANDBOXID.DOMAIN`). The connection is the runtime's port stream
//! (`SandboxRuntime::open_port`: opened by the sandbox's agent inside the sandbox, so no host port exists and the
//! host's own loopback is never what is reached); HTTP/1.1 is spoken over it with hyper's client. A WebSocket (any
//! `Upgrade`) answered `101` becomes a raw byte bridge between the client's connection and the stream.

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use sandkasten_types::Failure;

use crate::state::AppState;

/// Headers that belong to one hop (RFC 9110 §7.6.1), never passed on; `Connection`/`Upgrade` are set again for an
/// upgrade.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
];

/// Why a request could not be forwarded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ForwardError {
    /// The runtime could not open the stream (nothing listening, too many streams, the sandbox gone).
    #[error("{0}")]
    Open(Failure),
    /// The program on the port did not answer with HTTP (or closed the connection first).
    #[error("the server on port {port} in the sandbox did not answer with HTTP: {reason}")]
    NoAnswer {
        /// The port.
        port: u16,
        /// What hyper said.
        reason: String,
    },
}

/// What a forwarded request carries besides its method, body and the headers it came with.
pub(crate) struct Target<'a> {
    /// The sandbox.
    pub(crate) id: &'a str,
    /// The port inside it.
    pub(crate) port: u16,
    /// Path and query as the program on the port sees them (starting with `/`).
    pub(crate) path_and_query: String,
    /// Headers of the caller's own credentials (never passed on into the sandbox).
    pub(crate) strip: &'a [HeaderName],
    /// The `Host` the program sees (`None`: the caller's).
    pub(crate) host: Option<HeaderValue>,
}

/// The port a request names, as a number: 1 to 65535, else a message for a 400.
pub(crate) fn parse_port(text: &str) -> Result<u16, String> {
    match text.parse::<u32>() {
        Ok(port @ 1..=65535) => Ok(port as u16),
        _ => Err(format!("port {text:?} is not a port: ports are 1 to 65535")),
    }
}

/// Forwards `request` to `target` and answers what the program there answered.
pub(crate) async fn forward(
    state: &AppState,
    target: Target<'_>,
    mut request: Request,
) -> Result<Response, ForwardError> {
    let port = target.port;
    let no_answer = |error: hyper::Error| ForwardError::NoAnswer { port, reason: error.to_string() };
    let stream = state.runtime().open_port(target.id, port).await.map_err(ForwardError::Open)?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(stream)).await.map_err(no_answer)?;
    tokio::spawn(async move {
        // Ends when the response (or the upgraded bridge) is done with the stream.
        let _ = connection.with_upgrades().await;
    });
    let wants_upgrade = request.headers().contains_key(header::UPGRADE);
    let client_upgrade = wants_upgrade.then(|| hyper::upgrade::on(&mut request));
    let (mut parts, body) = request.into_parts();
    parts.uri = Uri::try_from(target.path_and_query.as_str())
        .map_err(|error| ForwardError::NoAnswer { port, reason: format!("bad path: {error}") })?;
    parts.version = axum::http::Version::HTTP_11;
    clean_headers(&mut parts.headers, wants_upgrade);
    for name in target.strip {
        parts.headers.remove(name);
    }
    if let Some(host) = target.host {
        parts.headers.insert(header::HOST, host);
    }
    let mut response = sender.send_request(Request::from_parts(parts, body)).await.map_err(no_answer)?;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_upgrade) = client_upgrade
    {
        let upstream_upgrade = hyper::upgrade::on(&mut response);
        tokio::spawn(async move {
            if let (Ok(client), Ok(upstream)) = tokio::join!(client_upgrade, upstream_upgrade) {
                let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(client), &mut TokioIo::new(upstream)).await;
            }
        });
        let (parts, _) = response.into_parts();
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    let (mut parts, body) = response.into_parts();
    clean_headers(&mut parts.headers, false);
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// Removes hop-by-hop headers (and those `Connection` names); an upgrade keeps `Connection: upgrade` and `Upgrade`.
fn clean_headers(headers: &mut HeaderMap, upgrade: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(',').map(str::trim).map(str::to_ascii_lowercase).collect::<Vec<_>>())
        .filter(|name| name != "upgrade")
        .filter_map(|name| HeaderName::try_from(name).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        headers.remove(header::UPGRADE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_1_to_65535_and_hop_by_hop_headers_stay_behind() {
        assert_eq!(parse_port("8000"), Ok(8000));
        for bad in ["0", "65536", "-1", "http", ""] {
            assert!(parse_port(bad).is_err(), "{bad}");
        }
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, x-secret"));
        headers.insert("x-secret", HeaderValue::from_static("1"));
        headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        headers.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        let mut plain = headers.clone();
        clean_headers(&mut plain, false);
        assert_eq!(plain.len(), 1, "{plain:?}");
        clean_headers(&mut headers, true);
        assert_eq!(headers.get(header::CONNECTION).map(|v| v.as_bytes()), Some(&b"upgrade"[..]));
        assert!(headers.contains_key(header::UPGRADE) && !headers.contains_key("x-secret"));
    }
}
