//! Responses the proxy writes itself (refusals, gateway errors) and the header hygiene of forwarded messages.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};

/// Body type of every response the proxy returns.
pub(crate) type Body = BoxBody<Bytes, hyper::Error>;

/// A short text response.
pub(crate) fn text(status: StatusCode, message: String) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(message)).map_err(|never| match never {}).boxed());
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    resp
}

/// `sandkasten egress: refused host:port: reason` (or `could not reach` for a 502).
pub(crate) fn refusal(status: StatusCode, target: &str, reason: &str) -> Response<Body> {
    let verb = if status == StatusCode::BAD_GATEWAY { "could not reach" } else { "refused" };
    text(status, format!("sandkasten egress: {verb} {target}: {reason}\n"))
}

/// An empty response (the 200 that opens a CONNECT tunnel).
pub(crate) fn empty(status: StatusCode) -> Response<Body> {
    let mut resp = Response::new(Empty::new().map_err(|never| match never {}).boxed());
    *resp.status_mut() = status;
    resp
}

/// Removes hop-by-hop headers (RFC 9110 7.6.1), including the ones named in `Connection` and the proxy's own
/// `Proxy-*` headers, so they are never forwarded. If the message was chunked, `Content-Length` goes too
/// (hyper re-frames the body).
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    if headers.contains_key(header::TRANSFER_ENCODING) {
        headers.remove(header::CONTENT_LENGTH);
    }
    for name in [
        header::CONNECTION,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
    headers.remove("proxy-connection");
    headers.remove("keep-alive");
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_removed() {
        let mut h = HeaderMap::new();
        h.insert("connection", "keep-alive, x-private".parse().unwrap());
        h.insert("x-private", "1".parse().unwrap());
        h.insert("proxy-authorization", "Basic abc".parse().unwrap());
        h.insert("proxy-connection", "keep-alive".parse().unwrap());
        h.insert("transfer-encoding", "chunked".parse().unwrap());
        h.insert("content-length", "5".parse().unwrap());
        h.insert("authorization", "Bearer x".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("authorization"));
    }
}
