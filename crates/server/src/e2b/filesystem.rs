//! envd's filesystem service (`/filesystem.Filesystem/*`): `Stat`, `MakeDir`, `Move`, `ListDir` (with depth) and
//! `Remove`, over the runtime's file calls (relative paths are under `/home/user`), answering as envd does (entries
//! and the walk order: `entries`; `Remove` of a missing path succeeds, `MakeDir` of an existing directory is
//! `already_exists`, of an existing file `invalid_argument`), and the directory watches (`watch`).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use sandkasten_types::{CommandUser, Failure, FailureKind, FileKind};
use serde::Deserialize;
use serde_json::json;

use crate::e2b::auth::{SandboxAccess, request_user, runtime_failure, sandbox_access, sandbox_user};
use crate::e2b::connect;
use crate::e2b::error::{Code, E2bError};
use crate::e2b::{entries, paths, watch};
use crate::state::AppState;

/// Deepest `ListDir` recursion.
const MAX_DEPTH: u32 = 16;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PathRequest {
    path: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ListDirRequest {
    path: String,
    depth: u32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct MoveRequest {
    source: String,
    destination: String,
}

/// `POST /filesystem.Filesystem/{method}`.
pub(crate) async fn call(
    State(state): State<AppState>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = async {
        let access = sandbox_access(&state, &headers).await?;
        let user = sandbox_user(&request_user(&headers)?)?;
        if user == CommandUser::Root && method.contains("Watch") {
            return Err(E2bError::unsupported("watching a directory as root (watch it as 'user')"));
        }
        match method.as_str() {
            "Stat" => stat(&state, &access, &body, user).await,
            "MakeDir" => make_dir(&state, &access, &body, user).await,
            "Move" => rename(&state, &access, &body, user).await,
            "ListDir" => list_dir(&state, &access, &body, user).await,
            "Remove" => remove(&state, &access, &body, user).await,
            "WatchDir" => watch::watch_dir(&state, &access, &body).await,
            "CreateWatcher" => watch::create_watcher(&state, &access, &body).await,
            "GetWatcherEvents" => watch::get_watcher_events(&state, &access, &body),
            "RemoveWatcher" => watch::remove_watcher(&state, &access, &body),
            other => Err(E2bError::new(Code::Unimplemented, format!("filesystem.Filesystem/{other} does not exist"))),
        }
    }
    .await;
    result.unwrap_or_else(E2bError::into_connect)
}

async fn checked<T>(state: &AppState, id: &str, result: Result<T, Failure>) -> Result<T, E2bError> {
    match result {
        Ok(value) => Ok(value),
        Err(failure) => Err(runtime_failure(state, id, failure).await),
    }
}

async fn stat(state: &AppState, access: &SandboxAccess, body: &[u8], user: CommandUser) -> Result<Response, E2bError> {
    let request: PathRequest = connect::decode(body)?;
    let path = paths::to_sandbox(&request.path)?;
    let info = checked(state, &access.id, state.runtime().stat_as(&access.id, &path, user).await).await?;
    Ok(connect::unary(&json!({ "entry": entries::entry(state, &access.id, &info, user).await? })))
}

/// Creates the directory and its missing parents; `already_exists` when it is there (the SDK answers `False`),
/// `invalid_argument` when something else is (envd's `os.Stat`, which follows a symlink to a directory).
async fn make_dir(
    state: &AppState,
    access: &SandboxAccess,
    body: &[u8],
    user: CommandUser,
) -> Result<Response, E2bError> {
    let request: PathRequest = connect::decode(body)?;
    let path = paths::to_sandbox(&request.path)?;
    match state.runtime().stat_as(&access.id, &path, user).await {
        Ok(info) => {
            let shown = entries::entry(state, &access.id, &info, user).await?;
            if shown["type"] == "FILE_TYPE_DIRECTORY" {
                return Err(E2bError::new(Code::AlreadyExists, format!("directory already exists: {path}")));
            }
            return Err(E2bError::invalid(format!("path already exists but it is not a directory: {path}")));
        }
        Err(failure) if failure.kind == FailureKind::NotFound => {}
        Err(failure) => return Err(runtime_failure(state, &access.id, failure).await),
    }
    checked(state, &access.id, state.runtime().mkdir_as(&access.id, &path, true, user).await).await?;
    let info = checked(state, &access.id, state.runtime().stat_as(&access.id, &path, user).await).await?;
    Ok(connect::unary(&json!({ "entry": entries::entry(state, &access.id, &info, user).await? })))
}

async fn rename(
    state: &AppState,
    access: &SandboxAccess,
    body: &[u8],
    user: CommandUser,
) -> Result<Response, E2bError> {
    let request: MoveRequest = connect::decode(body)?;
    let (from, to) = (paths::to_sandbox(&request.source)?, paths::to_sandbox(&request.destination)?);
    checked(state, &access.id, state.runtime().rename_as(&access.id, &from, &to, user).await).await?;
    let info = checked(state, &access.id, state.runtime().stat_as(&access.id, &to, user).await).await?;
    Ok(connect::unary(&json!({ "entry": entries::entry(state, &access.id, &info, user).await? })))
}

async fn remove(
    state: &AppState,
    access: &SandboxAccess,
    body: &[u8],
    user: CommandUser,
) -> Result<Response, E2bError> {
    let request: PathRequest = connect::decode(body)?;
    let path = paths::to_sandbox(&request.path)?;
    match state.runtime().remove_as(&access.id, &path, true, user).await {
        // envd removes with `os.RemoveAll`: nothing there is nothing to do.
        Ok(()) => {}
        Err(failure) if failure.kind == FailureKind::NotFound => {}
        Err(failure) => return Err(runtime_failure(state, &access.id, failure).await),
    }
    Ok(connect::unary(&json!({})))
}

/// Lists a directory `depth` levels deep (1 when not given) in envd's order (`entries::walk`); a symlink to a
/// directory lists that directory (under the path asked for), anything else is `invalid_argument`.
async fn list_dir(
    state: &AppState,
    access: &SandboxAccess,
    body: &[u8],
    user: CommandUser,
) -> Result<Response, E2bError> {
    let request: ListDirRequest = connect::decode(body)?;
    let depth = request.depth.clamp(1, MAX_DEPTH);
    let root = paths::to_sandbox(if request.path.is_empty() { paths::E2B_HOME } else { &request.path })?;
    let info = checked(state, &access.id, state.runtime().stat_as(&access.id, &root, user).await).await?;
    if info.kind != FileKind::Dir {
        let shown = entries::entry(state, &access.id, &info, user).await?;
        if shown["type"] != "FILE_TYPE_DIRECTORY" {
            return Err(E2bError::invalid(format!("path is not a directory: {root}")));
        }
    }
    let entries = entries::walk(state, &access.id, &root, depth, user).await?;
    Ok(connect::unary(&json!({ "entries": entries })))
}
