//! E2B's sandbox host names: a request whose `Host` is `PORT-SANDBOXID.DOMAIN` (what the SDK's `get_host(port)`
//! builds; `DOMAIN` is `[e2b] domain`, any domain when that is unset) goes to that port inside the sandbox
//! (`port_forward`), HTTP/1.1 and WebSocket upgrades alike, as E2B's edge proxy does. Ports 49983 (envd) and 49999
//! (the code interpreter) are the facade's own: such requests are served by its routes, as with `E2B_SANDBOX_URL`,
//! the host's sandbox id standing for the `E2b-Sandbox-Id` header.
//!
//! Access: a sandbox created with `network.allowPublicTraffic = true` is served to anyone who knows the name; any
//! other only with its traffic access token in `e2b-traffic-access-token` (403 with E2B's words otherwise) — unlike
//! E2B, whose default is public. The token never reaches the program on the port.

use axum::Json;
use axum::extract::{Request, State};
use axum::http::header::{HOST, HeaderName};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use subtle::ConstantTimeEq;

use crate::ids::is_sandbox_id;
use crate::port_forward::{ForwardError, Target, forward, parse_port};
use crate::state::AppState;
use crate::store::SandboxState;

/// envd's port and the code interpreter's: served by the facade's own routes.
const FACADE_PORTS: [u16; 2] = [49983, 49999];

/// The header holding the traffic access token.
const TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// The header the SDK names a sandbox in when it sends to `E2B_SANDBOX_URL`.
const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";

/// E2B's proxy error body: `{"sandboxId", "message", "code"}` (and `port` where one is meant).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ProxyError {
    sandbox_id: String,
    message: String,
    code: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    port: Option<u16>,
}

fn refuse(status: StatusCode, id: &str, port: Option<u16>, message: impl Into<String>) -> Response {
    let body = ProxyError { sandbox_id: id.to_owned(), message: message.into(), code: status.as_u16(), port };
    (status, Json(body)).into_response()
}

/// What a `Host` names: `Some((port text, sandbox id))` for `PORT-SANDBOXID.DOMAIN`, `None` for any other host.
fn port_host<'a>(host: &'a str, domain: Option<&str>) -> Option<(&'a str, &'a str)> {
    let host = host.rsplit_once(':').filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit())).map_or(host, |h| h.0);
    let (label, rest) = host.split_once('.')?;
    let (port, id) = label.split_once('-')?;
    let rest_ok = match domain {
        Some(domain) => rest.eq_ignore_ascii_case(domain),
        None => !rest.is_empty(),
    };
    (rest_ok && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) && is_sandbox_id(id)).then_some((port, id))
}

/// The middleware in front of every route: port host names are forwarded, everything else goes on.
pub(crate) async fn route_by_host(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let host = request.headers().get(HOST).and_then(|value| value.to_str().ok()).map(str::to_owned);
    let domain = state.effective_config().e2b.domain.clone();
    let Some((port, id)) = host.as_deref().and_then(|host| port_host(host, domain.as_deref())) else {
        return next.run(request).await;
    };
    let id = id.to_owned();
    let port = match parse_port(port) {
        Ok(port) if FACADE_PORTS.contains(&port) => {
            return match name_sandbox(request.headers_mut(), &id) {
                Ok(()) => next.run(request).await,
                Err(message) => refuse(StatusCode::BAD_REQUEST, &id, None, message),
            };
        }
        Ok(port) => port,
        Err(message) => return refuse(StatusCode::BAD_REQUEST, &id, None, message),
    };
    serve(&state, &id, port, request).await
}

/// A request to envd's or the interpreter's port by host name names its sandbox there, as E2B's edge proxy routes
/// it: the facade's routes read the sandbox from `E2b-Sandbox-Id`, so the host's id becomes that header (a signed
/// `/files` URL opened in a browser sends nothing else). A header naming another sandbox is refused.
fn name_sandbox(headers: &mut HeaderMap, id: &str) -> Result<(), String> {
    match headers.get(SANDBOX_ID_HEADER) {
        Some(named) if named.as_bytes() != id.as_bytes() => {
            Err(format!("the host names sandbox {id} but the E2b-Sandbox-Id header another: send one of them"))
        }
        Some(_) => Ok(()),
        None => {
            let value = HeaderValue::from_str(id).map_err(|_| format!("sandbox id {id:?} is not a header value"))?;
            headers.insert(SANDBOX_ID_HEADER, value);
            Ok(())
        }
    }
}

async fn serve(state: &AppState, id: &str, port: u16, request: Request) -> Response {
    let gone = || {
        refuse(
            StatusCode::BAD_GATEWAY,
            id,
            None,
            format!("sandbox {id} was not found: it was killed or reached its timeout"),
        )
    };
    let Some(session) = state.e2b().get(id) else { return gone() };
    state.transitions().settled(id).await;
    let record = match state.store().sandbox(&session.tenant.name, id).await {
        Ok(Some(record)) => record,
        Ok(None) => return gone(),
        Err(error) => return crate::api::error::ApiError::from(error).into_response(),
    };
    if let Some(message) = refusal(request.headers(), &session.token, record.spec.network.allow_public_traffic) {
        return refuse(StatusCode::FORBIDDEN, id, None, message);
    }
    match record.state {
        SandboxState::Running => {}
        SandboxState::Paused if record.lifecycle.auto_resume => {
            if let Err(error) = crate::lifecycle::ensure_resumed(state, &session.tenant, id).await {
                return crate::api::error::ApiError::from(error).into_response();
            }
        }
        SandboxState::Paused => {
            return refuse(
                StatusCode::CONFLICT,
                id,
                None,
                format!("sandbox {id} is paused: resume it (Sandbox.connect)"),
            );
        }
        _ => return gone(),
    }
    let path_and_query = request.uri().path_and_query().map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
    let strip = [HeaderName::from_static(TOKEN_HEADER)];
    let target = Target { id, port, path_and_query, strip: &strip, host: None };
    match forward(state, target, request).await {
        Ok(response) => response,
        Err(ForwardError::Open(failure)) => {
            if failure.kind == sandkasten_types::FailureKind::NothingListening {
                return refuse(StatusCode::BAD_GATEWAY, id, Some(port), failure.message);
            }
            crate::e2b::auth::runtime_failure(state, id, failure).await.into_response()
        }
        Err(error @ ForwardError::NoAnswer { .. }) => {
            refuse(StatusCode::BAD_GATEWAY, id, Some(port), error.to_string())
        }
    }
}

/// Why the request may not reach the sandbox's ports (E2B's words), if it may not: it always may when the sandbox's
/// traffic is public, else only with the token.
fn refusal(headers: &HeaderMap, token: &str, public: bool) -> Option<String> {
    let why = match headers.get(TOKEN_HEADER) {
        _ if public => return None,
        Some(presented) if bool::from(token.as_bytes().ct_eq(presented.as_bytes())) => return None,
        Some(_) => "is invalid",
        None => "is missing",
    };
    Some(format!("Sandbox is secured with traffic access token. Token header '{TOKEN_HEADER}' {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_port_dash_sandbox_id_dot_domain_is_a_port_host() {
        let id = "sb-0123456789abcdef";
        assert_eq!(port_host(&format!("8000-{id}.e2b.app"), None), Some(("8000", id)));
        assert_eq!(port_host(&format!("8000-{id}.e2b.app:443"), None), Some(("8000", id)));
        assert_eq!(
            port_host(&format!("8000-{id}.sandboxes.example.com"), Some("sandboxes.example.com")),
            Some(("8000", id))
        );
        assert_eq!(port_host(&format!("8000-{id}.e2b.app"), Some("sandboxes.example.com")), None, "another domain");
        assert_eq!(port_host(&format!("99999-{id}.e2b.app"), None), Some(("99999", id)), "a bad port is still meant");
        for other in
            ["127.0.0.1:8080", "localhost", &format!("8000-{id}"), "8000-sb-xyz.e2b.app", &format!("x-{id}.e2b.app")]
        {
            assert_eq!(port_host(other, None), None, "{other}");
        }
    }

    #[test]
    fn envd_s_host_name_names_the_sandbox_as_the_header_would() {
        let id = "sb-0123456789abcdef";
        let mut headers = HeaderMap::new();
        assert!(name_sandbox(&mut headers, id).is_ok());
        assert_eq!(headers.get(SANDBOX_ID_HEADER).map(HeaderValue::as_bytes), Some(id.as_bytes()));
        assert!(name_sandbox(&mut headers, id).is_ok(), "the same sandbox twice is fine");
        let mut other = HeaderMap::new();
        other.insert(SANDBOX_ID_HEADER, HeaderValue::from_static("sb-fedcba9876543210"));
        assert!(name_sandbox(&mut other, id).is_err_and(|message| message.contains("one of them")));
    }
}
