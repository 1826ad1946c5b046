//! Tar archives in and out of a sandbox: `PUT …/files/archive?path=DIR` unpacks a plain tar under DIR (created if
//! missing) and `GET …/files/archive?path=P` returns the tar of P. An upload is checked whole before anything is
//! written (`plan`): only regular files and directories, no links, no absolute or `..` names; file modes and
//! owners in the archive are not applied (files are created 0644 minus the sandbox's umask). Extraction goes through
//! the runtime's `mkdir` and `write_file`, so the agent confines every path once more. A runtime failure half-way
//! (disk full, an existing file where the archive has a directory) leaves what was written before it.

mod pack;
mod plan;

use axum::Json;
use axum::extract::{Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{IdPath, QueryParams, read_limited, running_sandbox, runtime_result};
use crate::api::schemas::{FileBytes, PathQuery};
use crate::auth::Tenant;
use crate::state::AppState;
use crate::validate::sandbox_path;

/// The media type of archives, both ways.
const TAR: &str = "application/x-tar";

/// `PUT /v1/sandboxes/{id}/files/archive`: what was unpacked.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ArchiveSummary {
    /// Regular files written.
    pub files: u64,
    /// Directories created or already present (declared in the archive or implied by a deeper entry).
    pub directories: u64,
    /// Bytes of file content written.
    pub bytes: u64,
}

fn under(target: &str, relative: &str) -> String {
    if target == "/" { format!("/{relative}") } else { format!("{target}/{relative}") }
}

/// Unpack a tar archive into a directory.
#[utoipa::path(
    put, path = "/v1/sandboxes/{id}/files/archive", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), PathQuery),
    request_body(
        content = FileBytes, content_type = "application/x-tar",
        description = "A plain (uncompressed) tar of regular files and directories, at most max_file_bytes. Links, \
            devices, fifos, absolute names and names with '..' are refused before anything is written; modes and \
            owners are not applied"
    ),
    responses(
        (status = 200, description = "Unpacked under `path` (created if missing)", body = ArchiveSummary),
        (status = 400, description = "Bad path, not a plain tar, or an unsafe entry (named in the message)",
            body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "The sandbox has ended, or a path exists with another kind", body = ErrorBody),
        (status = 413, description = "Archive or its content larger than max_file_bytes, more than 100 000 entries, \
            or the sandbox's disk is full", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn upload(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
    QueryParams(query): QueryParams<PathQuery>,
    request: Request,
) -> Result<Json<ArchiveSummary>, ApiError> {
    running_sandbox(&state, &tenant, &id).await?;
    sandbox_path("path", &query.path).map_err(ApiError::bad_request)?;
    let target = match query.path.trim_end_matches('/') {
        "" => "/",
        trimmed => trimmed,
    };
    let max = state.settings().max_file_bytes;
    let archive = read_limited(request, max, "the archive").await?;
    let plan = plan::plan(&archive, target, max)?;
    let runtime = state.runtime();
    runtime_result(&state, &id, runtime.mkdir(&id, target, true).await).await?;
    for dir in &plan.dirs {
        runtime_result(&state, &id, runtime.mkdir(&id, &under(target, dir), true).await).await?;
    }
    let mut bytes = 0u64;
    for (path, slice) in &plan.files {
        let data = archive.get(slice.offset..slice.offset + slice.len).unwrap_or_default().to_vec();
        bytes += data.len() as u64;
        runtime_result(&state, &id, runtime.write_file(&id, &under(target, path), data).await).await?;
    }
    Ok(Json(ArchiveSummary { files: plan.files.len() as u64, directories: plan.dirs.len() as u64, bytes }))
}

/// Download a directory tree (or one file) as a tar archive.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/files/archive", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), PathQuery),
    responses(
        (status = 200, description = "A tar of `path`: entry names relative to it (a file is stored under its base \
            name); symlinks are stored as links, not followed; sockets, fifos and devices are left out",
            body = FileBytes, content_type = "application/x-tar"),
        (status = 400, description = "Bad path, or the path is a socket, fifo or device", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or path", body = ErrorBody),
        (status = 409, description = "The sandbox has ended", body = ErrorBody),
        (status = 413, description = "The files together are larger than max_file_bytes, or more than 100 000 \
            entries", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn download(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
    QueryParams(query): QueryParams<PathQuery>,
) -> Result<Response, ApiError> {
    running_sandbox(&state, &tenant, &id).await?;
    sandbox_path("path", &query.path).map_err(ApiError::bad_request)?;
    let info = runtime_result(&state, &id, state.runtime().stat(&id, &query.path).await).await?;
    let tar = pack::pack(&state, &id, &info, state.settings().max_file_bytes).await?;
    Ok(([(CONTENT_TYPE, TAR)], tar).into_response())
}
