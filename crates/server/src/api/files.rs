//! Files inside a sandbox: read and write raw bytes, remove, list, stat, mkdir, rename. Every path is checked
//! (absolute, no NUL, no `..`, at most 4096 bytes) before the runtime sees it; the runtime confines it again.

use axum::Json;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};

use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{IdPath, JsonBody, QueryParams, read_limited, running_sandbox, runtime_result};
use crate::api::schemas::{FileBytes, FileInfoBody, FileList, MkdirRequest, PathQuery, RemoveQuery, RenameRequest};
use crate::auth::Tenant;
use crate::state::AppState;
use crate::validate::sandbox_path;

fn checked(what: &str, path: &str) -> Result<(), ApiError> {
    sandbox_path(what, path).map_err(ApiError::bad_request)
}

/// Read a file.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), PathQuery),
    responses(
        (status = 200, description = "The file's bytes", body = FileBytes, content_type = "application/octet-stream"),
        (status = 400, description = "Bad path", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or file", body = ErrorBody),
        (status = 409, description = "The sandbox has ended, or the path is a directory", body = ErrorBody),
        (status = 413, description = "The file is larger than the server's max_file_bytes", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn read(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
    QueryParams(query): QueryParams<PathQuery>,
) -> Result<Response, ApiError> {
    let data = read_bytes(&state, &tenant, &id, &query.path).await?;
    Ok(([(CONTENT_TYPE, "application/octet-stream")], data).into_response())
}

/// The bytes of `path` in the caller's running sandbox `id` (at most the server's `max_file_bytes`).
pub(crate) async fn read_bytes(state: &AppState, tenant: &Tenant, id: &str, path: &str) -> Result<Vec<u8>, ApiError> {
    running_sandbox(state, tenant, id).await?;
    checked("path", path)?;
    let max = state.settings().max_file_bytes;
    runtime_result(state, id, state.runtime().read_file(id, path, max).await).await
}

/// Writes `data` to `path` (created or replaced) in the caller's running sandbox `id`.
pub(crate) async fn write_bytes(
    state: &AppState,
    tenant: &Tenant,
    id: &str,
    path: &str,
    data: Vec<u8>,
) -> Result<(), ApiError> {
    running_sandbox(state, tenant, id).await?;
    checked("path", path)?;
    let max = state.settings().max_file_bytes;
    if data.len() as u64 > max {
        return Err(ApiError::payload_too_large(format!("the file is larger than the limit of {max} bytes")));
    }
    runtime_result(state, id, state.runtime().write_file(id, path, data).await).await
}

/// The entries of directory `path` in the caller's running sandbox `id`.
pub(crate) async fn list_entries(
    state: &AppState,
    tenant: &Tenant,
    id: &str,
    path: &str,
) -> Result<FileList, ApiError> {
    running_sandbox(state, tenant, id).await?;
    checked("path", path)?;
    let entries = runtime_result(state, id, state.runtime().list_dir(id, path).await).await?;
    Ok(FileList { entries: entries.into_iter().map(FileInfoBody::from).collect() })
}

/// Write a file (created or replaced) from the raw request body.
#[utoipa::path(
    put, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), PathQuery),
    request_body(content = FileBytes, content_type = "application/octet-stream", description = "The file's bytes"),
    responses(
        (status = 204, description = "Written"),
        (status = 400, description = "Bad path", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox, or the parent directory is missing", body = ErrorBody),
        (status = 409, description = "The sandbox has ended, or the path is a directory", body = ErrorBody),
        (status = 413, description = "Larger than max_file_bytes or the sandbox's disk", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn write(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
    QueryParams(query): QueryParams<PathQuery>,
    request: Request,
) -> Result<StatusCode, ApiError> {
    running_sandbox(&state, &tenant, &id).await?;
    checked("path", &query.path)?;
    let data = read_limited(request, state.settings().max_file_bytes, "the file").await?;
    write_bytes(&state, &tenant, &id, &query.path, data).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Remove a file or directory.
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), RemoveQuery),
    responses(
        (status = 204, description = "Removed"),
        (status = 400, description = "Bad path", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or path", body = ErrorBody),
        (status = 409, description = "The sandbox has ended, or the directory is not empty", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn remove(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
    QueryParams(query): QueryParams<RemoveQuery>,
) -> Result<StatusCode, ApiError> {
    running_sandbox(&state, &tenant, &id).await?;
    checked("path", &query.path)?;
    runtime_result(&state, &id, state.runtime().remove(&id, &query.path, query.recursive).await).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// List a directory.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/files/list", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), PathQuery),
    responses(
        (status = 200, description = "The directory's entries", body = FileList),
        (status = 400, description = "Bad path", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or directory", body = ErrorBody),
        (status = 409, description = "The sandbox has ended, or the path is not a directory", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn list(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
    QueryParams(query): QueryParams<PathQuery>,
) -> Result<Json<FileList>, ApiError> {
    Ok(Json(list_entries(&state, &tenant, &id, &query.path).await?))
}

/// Describe a path (a final symlink is not followed).
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/files/stat", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), PathQuery),
    responses(
        (status = 200, description = "The path's metadata", body = FileInfoBody),
        (status = 400, description = "Bad path", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or path", body = ErrorBody),
        (status = 409, description = "The sandbox has ended", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn stat(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
    QueryParams(query): QueryParams<PathQuery>,
) -> Result<Json<FileInfoBody>, ApiError> {
    running_sandbox(&state, &tenant, &id).await?;
    checked("path", &query.path)?;
    let info = runtime_result(&state, &id, state.runtime().stat(&id, &query.path).await).await?;
    Ok(Json(info.into()))
}

/// Create a directory.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/files/mkdir", tag = "files",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = MkdirRequest,
    responses(
        (status = 204, description = "Created"),
        (status = 400, description = "Malformed JSON or bad path", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox, or a parent is missing", body = ErrorBody),
        (status = 409, description = "The sandbox has ended, or the path exists", body = ErrorBody),
        (status = 422, description = "Missing or mistyped fields", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn mkdir(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
    JsonBody(body): JsonBody<MkdirRequest>,
) -> Result<StatusCode, ApiError> {
    running_sandbox(&state, &tenant, &id).await?;
    checked("path", &body.path)?;
    runtime_result(&state, &id, state.runtime().mkdir(&id, &body.path, body.parents).await).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Rename (move) a path.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/files/rename", tag = "files",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = RenameRequest,
    responses(
        (status = 204, description = "Renamed"),
        (status = 400, description = "Malformed JSON or bad path", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or source path", body = ErrorBody),
        (status = 409, description = "The sandbox has ended, or the destination conflicts", body = ErrorBody),
        (status = 422, description = "Missing or mistyped fields", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn rename(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
    JsonBody(body): JsonBody<RenameRequest>,
) -> Result<StatusCode, ApiError> {
    running_sandbox(&state, &tenant, &id).await?;
    checked("from", &body.from)?;
    checked("to", &body.to)?;
    runtime_result(&state, &id, state.runtime().rename(&id, &body.from, &body.to).await).await?;
    Ok(StatusCode::NO_CONTENT)
}
