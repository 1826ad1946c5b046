//! The MCP endpoint, `/mcp` (streamable HTTP, rmcp's server): tools that create sandboxes and run code, commands
//! and file operations in them through the server's own service layer, as the tenant of the request's API key.
//!
//! Every request passes `guard` first: no key or a wrong key is 401 before rmcp sees it; a session id opened with
//! another tenant's key is answered 404 as for an unknown session; an `initialize` past the tenant's
//! `[mcp] max_sessions_per_tenant` is 429. Sessions end at `DELETE`, after `[mcp] idle_timeout_s` without a request,
//! and at shutdown; their sandboxes (not `persist`) are killed then (`sessions`, `tracked`).

mod ending;
mod handler;
mod render;
pub(crate) mod sessions;
mod tools_files;
mod tools_run;
mod tools_sandboxes;
mod tools_scan;
mod tracked;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use crate::api::error::{ApiError, ErrorCode};
use crate::api::request_log::LoggedTenant;
use crate::state::AppState;

pub(crate) use ending::close_all as close_sessions;

/// The path of the endpoint.
pub(crate) const PATH: &str = "/mcp";

/// The `/mcp` route over `state`.
pub(crate) fn routes(state: &AppState) -> Router<AppState> {
    let idle = Duration::from_secs(state.mcp_config().idle_timeout_s);
    let config = StreamableHttpServerConfig::default()
        .with_cancellation_token(state.mcp_sessions().stopping().child_token())
        .with_max_request_body_bytes(usize::try_from(state.settings().max_json_bytes).unwrap_or(usize::MAX))
        // Requests carry a bearer key, which a page that rebinds DNS to this host does not have: the Host check
        // (meant for unauthenticated local servers) would only refuse the server's real names.
        .disable_allowed_hosts();
    let handler_state = state.clone();
    let service = StreamableHttpService::new(
        move || Ok(handler::SandboxTools::new(handler_state.clone())),
        Arc::new(tracked::TrackedSessions::new(state.clone(), idle)),
        config,
    );
    Router::new().route_service(PATH, service).route_layer(middleware::from_fn_with_state(state.clone(), guard))
}

/// Authenticates the request and checks its session against the tenant (see the module's doc).
async fn guard(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let tenant = match state.keyring().authenticate(request.headers().get(AUTHORIZATION)) {
        Ok(tenant) => tenant,
        Err(error) => {
            tracing::debug!(reason = %error, "mcp request refused");
            let mut response = ApiError::unauthorized(error.to_string()).into_response();
            response.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return response;
        }
    };
    let session = request.headers().get("mcp-session-id").and_then(|value| value.to_str().ok()).map(str::to_owned);
    match session {
        Some(session) if state.mcp_sessions().owner(&session).is_some_and(|owner| owner != tenant.name) => {
            return ApiError::not_found(format!("no MCP session {session} for this API key: initialize a new session"))
                .into_response();
        }
        None if request.method() == Method::POST => {
            let max = state.mcp_config().max_sessions_per_tenant;
            if state.mcp_sessions().count(&tenant.name) >= max {
                return ApiError::new(
                    ErrorCode::QuotaExceeded,
                    format!(
                        "tenant {} has {max} MCP sessions open ([mcp] max_sessions_per_tenant): end one \
                         (DELETE /mcp with its Mcp-Session-Id) or wait for an idle one to expire",
                        tenant.name
                    ),
                )
                .into_response();
            }
        }
        _ => {}
    }
    let logged = LoggedTenant(Arc::clone(&tenant.name));
    let ending = request.method() == Method::DELETE;
    request.extensions_mut().insert(tenant.clone());
    let mut response = tracked::CALLER.scope(tenant, next.run(request)).await;
    response.extensions_mut().insert(logged);
    // rmcp answers a session's DELETE with 202; clients (the official Python one) expect 200 or 204 for "ended".
    if ending && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::OK;
    }
    response
}
