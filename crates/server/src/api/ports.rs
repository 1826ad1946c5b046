//! `/v1/sandboxes/{id}/ports/{port}/{path…}`: any HTTP request (and a WebSocket upgrade) forwarded to a server
//! listening on that port inside the caller's sandbox (`port_forward`), with the caller's API key left behind.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::HeaderValue;
use axum::http::header::{AUTHORIZATION, HeaderName};
use axum::response::Response;

use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{running_sandbox, runtime_error};
use crate::auth::Tenant;
use crate::port_forward::{ForwardError, Target, forward, parse_port};
use crate::state::AppState;

/// Forward a request to a port inside the sandbox.
#[utoipa::path(
    method(get, post, put, delete, patch, head, options),
    path = "/v1/sandboxes/{id}/ports/{port}/{path}", tag = "sandboxes",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("port" = u16, Path, description = "Port inside the sandbox (1 to 65535)"),
        ("path" = String, Path, description = "Path passed to the server on the port (the query string too)"),
    ),
    responses(
        (status = 200, description = "What the server on the port answered (any status, headers and body); a \
            WebSocket upgrade is answered 101 and the connection then carries the WebSocket"),
        (status = 400, description = "Not a port (0, above 65535, not a number)", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "The sandbox has ended, or has 32 port connections open", body = ErrorBody),
        (status = 502, description = "Nothing listens on the port inside the sandbox, or it did not answer with \
            HTTP", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn forward_path(
    State(state): State<AppState>,
    tenant: Tenant,
    params: Result<Path<(String, String, String)>, PathRejection>,
    request: Request,
) -> Result<Response, ApiError> {
    let Path((id, port, path)) = params?;
    serve(&state, &tenant, &id, &port, &path, request).await
}

/// The same for the port's root (`/v1/sandboxes/{id}/ports/{port}` and `…/{port}/`).
pub(crate) async fn forward_root(
    State(state): State<AppState>,
    tenant: Tenant,
    params: Result<Path<(String, String)>, PathRejection>,
    request: Request,
) -> Result<Response, ApiError> {
    let Path((id, port)) = params?;
    serve(&state, &tenant, &id, &port, "", request).await
}

async fn serve(
    state: &AppState,
    tenant: &Tenant,
    id: &str,
    port: &str,
    path: &str,
    request: Request,
) -> Result<Response, ApiError> {
    let port = parse_port(port).map_err(ApiError::bad_request)?;
    running_sandbox(state, tenant, id).await?;
    let query = request.uri().query().map(|query| format!("?{query}")).unwrap_or_default();
    let host = HeaderValue::from_str(&format!("localhost:{port}")).map_err(ApiError::internal)?;
    let strip = [AUTHORIZATION, HeaderName::from_static("x-api-key")];
    let target = Target { id, port, path_and_query: format!("/{path}{query}"), strip: &strip, host: Some(host) };
    match forward(state, target, request).await {
        Ok(response) => Ok(response),
        Err(ForwardError::Open(failure)) => Err(runtime_error(state, id, failure).await),
        Err(error @ ForwardError::NoAnswer { .. }) => {
            Err(ApiError::new(crate::api::error::ErrorCode::NothingListening, error.to_string()))
        }
    }
}
