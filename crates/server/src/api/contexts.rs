//! `/v1/sandboxes/{id}/contexts`: create, list, restart and remove stateful code contexts (interpreters whose
//! variables persist across `POST /code` calls).

use axum::Json;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};

use crate::api::code_schemas::{ContextBody, ContextList, CreateContextBody};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{IdPath, JsonBody, running_sandbox, runtime_result};
use crate::auth::Tenant;
use crate::state::AppState;

/// True for strings shaped like a context id (`ctx-` + 16 lowercase hex digits); anything else cannot exist.
pub(crate) fn is_context_id(text: &str) -> bool {
    text.len() == 20
        && text.starts_with("ctx-")
        && text.bytes().skip(4).all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `{id}` and `{context_id}` path segments; segments that cannot be decoded are a 400.
#[derive(Debug)]
pub(crate) struct ContextPath(String, String);

impl<S: Send + Sync> FromRequestParts<S> for ContextPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path((id, context)) = Path::<(String, String)>::from_request_parts(parts, state).await?;
        Ok(ContextPath(id, context))
    }
}

fn context_not_found(context: &str) -> ApiError {
    ApiError::not_found(format!("no code context {context} in this sandbox"))
}

/// Create a code context.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/contexts", tag = "code",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = CreateContextBody,
    responses(
        (status = 201, description = "The context, its interpreter started", body = ContextBody),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox for this tenant", body = ErrorBody),
        (status = 409, description = "The sandbox has ended", body = ErrorBody),
        (status = 422, description = "Unknown language, too many contexts, or the interpreter cannot start",
            body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn create(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
    JsonBody(body): JsonBody<CreateContextBody>,
) -> Result<Response, ApiError> {
    running_sandbox(&state, &tenant, &id).await?;
    if let Some(cwd) = &body.cwd {
        crate::validate::sandbox_path("cwd", cwd).map_err(ApiError::bad_request)?;
    }
    let created = state.runtime().create_context(&id, body.language.into(), body.cwd).await;
    let info = runtime_result(&state, &id, created).await?;
    Ok((StatusCode::CREATED, Json(ContextBody::from(info))).into_response())
}

/// List a sandbox's code contexts.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/contexts", tag = "code",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "The contexts", body = ContextList),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox for this tenant", body = ErrorBody),
        (status = 409, description = "The sandbox has ended", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn list(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
) -> Result<Json<ContextList>, ApiError> {
    running_sandbox(&state, &tenant, &id).await?;
    let contexts = runtime_result(&state, &id, state.runtime().list_contexts(&id).await).await?;
    Ok(Json(ContextList { contexts: contexts.into_iter().map(ContextBody::from).collect() }))
}

/// Remove a code context (its interpreter is killed).
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}/contexts/{context_id}", tag = "code",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("context_id" = String, Path, description = "Context id"),
    ),
    responses(
        (status = 204, description = "Removed"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or context for this tenant", body = ErrorBody),
        (status = 409, description = "The sandbox has ended", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn delete(
    State(state): State<AppState>,
    tenant: Tenant,
    ContextPath(id, context): ContextPath,
) -> Result<StatusCode, ApiError> {
    running_sandbox(&state, &tenant, &id).await?;
    if !is_context_id(&context) {
        return Err(context_not_found(&context));
    }
    runtime_result(&state, &id, state.runtime().remove_context(&id, &context).await).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Restart a code context's interpreter (its variables are lost).
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/contexts/{context_id}/restart", tag = "code",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("context_id" = String, Path, description = "Context id"),
    ),
    responses(
        (status = 200, description = "The context, with a fresh interpreter", body = ContextBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or context for this tenant", body = ErrorBody),
        (status = 409, description = "The sandbox has ended", body = ErrorBody),
        (status = 422, description = "The interpreter cannot start", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn restart(
    State(state): State<AppState>,
    tenant: Tenant,
    ContextPath(id, context): ContextPath,
) -> Result<Json<ContextBody>, ApiError> {
    running_sandbox(&state, &tenant, &id).await?;
    if !is_context_id(&context) {
        return Err(context_not_found(&context));
    }
    let info = runtime_result(&state, &id, state.runtime().restart_context(&id, &context).await).await?;
    Ok(Json(ContextBody::from(info)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_ids_are_recognised() {
        assert!(is_context_id("ctx-0123456789abcdef"));
        assert!(!is_context_id("ctx-0123456789ABCDEF"));
        assert!(!is_context_id("ctx-../../etc/passwd"));
        assert!(!is_context_id("sb-0123456789abcdef"));
    }
}
