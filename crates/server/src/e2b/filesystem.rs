//! envd's filesystem service (`/filesystem.Filesystem/*`): `Stat`, `MakeDir`, `Move`, `ListDir` (with depth) and
//! `Remove`, over the runtime's file calls (relative paths are under `/home/user`), and the directory watches
//! (`watch`).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use sandkasten_types::{Failure, FailureKind, FileInfo, FileKind};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::clock::rfc3339;
use crate::e2b::auth::{SandboxAccess, request_user, require_default_user, runtime_failure, sandbox_access};
use crate::e2b::connect;
use crate::e2b::error::{Code, E2bError};
use crate::e2b::{paths, watch};
use crate::state::AppState;

/// Deepest `ListDir` recursion.
const MAX_DEPTH: u32 = 16;
/// Most entries one `ListDir` answers.
const MAX_ENTRIES: usize = 10_000;

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
        require_default_user(&request_user(&headers)?)?;
        match method.as_str() {
            "Stat" => stat(&state, &access, &body).await,
            "MakeDir" => make_dir(&state, &access, &body).await,
            "Move" => rename(&state, &access, &body).await,
            "ListDir" => list_dir(&state, &access, &body).await,
            "Remove" => remove(&state, &access, &body).await,
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

fn permissions(kind: FileKind, mode: u32) -> String {
    let mut text = String::from(match kind {
        FileKind::Dir => "d",
        FileKind::Symlink => "L",
        FileKind::File | FileKind::Other => "-",
    });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 0o7;
        text.push(if bits & 4 != 0 { 'r' } else { '-' });
        text.push(if bits & 2 != 0 { 'w' } else { '-' });
        text.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    text
}

/// The name of a uid or gid inside a facade sandbox (`/etc/passwd` of the `e2b` template).
fn name_of(id: u32) -> String {
    match id {
        0 => String::from("root"),
        1000 => String::from("user"),
        65534 => String::from("nobody"),
        other => other.to_string(),
    }
}

/// envd's `EntryInfo` of a runtime `FileInfo`, in the proto3 JSON mapping.
fn entry(info: &FileInfo) -> Value {
    let kind = match info.kind {
        FileKind::File => "FILE_TYPE_FILE",
        FileKind::Dir => "FILE_TYPE_DIRECTORY",
        FileKind::Symlink => "FILE_TYPE_SYMLINK",
        FileKind::Other => "FILE_TYPE_UNSPECIFIED",
    };
    let mut entry = json!({
        "name": info.name,
        "type": kind,
        "path": info.path,
        "size": info.size.to_string(),
        "mode": info.mode & 0o7777,
        "permissions": permissions(info.kind, info.mode),
        "owner": name_of(info.uid),
        "group": name_of(info.gid),
        "modifiedTime": rfc3339(info.modified_unix_ms),
        "isSymlink": info.kind == FileKind::Symlink,
    });
    if let (Some(target), Some(object)) = (&info.symlink_target, entry.as_object_mut()) {
        object.insert("symlinkTarget".into(), Value::String(target.clone()));
    }
    entry
}

async fn checked<T>(state: &AppState, id: &str, result: Result<T, Failure>) -> Result<T, E2bError> {
    match result {
        Ok(value) => Ok(value),
        Err(failure) => Err(runtime_failure(state, id, failure).await),
    }
}

async fn stat(state: &AppState, access: &SandboxAccess, body: &[u8]) -> Result<Response, E2bError> {
    let request: PathRequest = connect::decode(body)?;
    let path = paths::to_sandbox(&request.path)?;
    let info = checked(state, &access.id, state.runtime().stat(&access.id, &path).await).await?;
    Ok(connect::unary(&json!({ "entry": entry(&info) })))
}

/// Creates the directory and its missing parents; `already_exists` when it is there (the SDK answers `False`).
async fn make_dir(state: &AppState, access: &SandboxAccess, body: &[u8]) -> Result<Response, E2bError> {
    let request: PathRequest = connect::decode(body)?;
    let path = paths::to_sandbox(&request.path)?;
    match state.runtime().stat(&access.id, &path).await {
        Ok(_) => return Err(E2bError::new(Code::AlreadyExists, format!("{} already exists", request.path))),
        Err(failure) if failure.kind == FailureKind::NotFound => {}
        Err(failure) => return Err(runtime_failure(state, &access.id, failure).await),
    }
    checked(state, &access.id, state.runtime().mkdir(&access.id, &path, true).await).await?;
    let info = checked(state, &access.id, state.runtime().stat(&access.id, &path).await).await?;
    Ok(connect::unary(&json!({ "entry": entry(&info) })))
}

async fn rename(state: &AppState, access: &SandboxAccess, body: &[u8]) -> Result<Response, E2bError> {
    let request: MoveRequest = connect::decode(body)?;
    let (from, to) = (paths::to_sandbox(&request.source)?, paths::to_sandbox(&request.destination)?);
    checked(state, &access.id, state.runtime().rename(&access.id, &from, &to).await).await?;
    let info = checked(state, &access.id, state.runtime().stat(&access.id, &to).await).await?;
    Ok(connect::unary(&json!({ "entry": entry(&info) })))
}

async fn remove(state: &AppState, access: &SandboxAccess, body: &[u8]) -> Result<Response, E2bError> {
    let request: PathRequest = connect::decode(body)?;
    let path = paths::to_sandbox(&request.path)?;
    checked(state, &access.id, state.runtime().remove(&access.id, &path, true).await).await?;
    Ok(connect::unary(&json!({})))
}

/// Lists a directory `depth` levels deep (1 when not given), breadth first.
async fn list_dir(state: &AppState, access: &SandboxAccess, body: &[u8]) -> Result<Response, E2bError> {
    let request: ListDirRequest = connect::decode(body)?;
    let depth = request.depth.clamp(1, MAX_DEPTH);
    let root = paths::to_sandbox(if request.path.is_empty() { paths::E2B_HOME } else { &request.path })?;
    let mut entries = Vec::new();
    let mut level = vec![root];
    for _ in 0..depth {
        let mut next = Vec::new();
        for dir in level {
            let listed = checked(state, &access.id, state.runtime().list_dir(&access.id, &dir).await).await?;
            for info in listed {
                if info.kind == FileKind::Dir {
                    next.push(info.path.clone());
                }
                entries.push(entry(&info));
                if entries.len() > MAX_ENTRIES {
                    return Err(E2bError::new(
                        Code::ResourceExhausted,
                        format!("more than {MAX_ENTRIES} entries: list with a smaller depth"),
                    ));
                }
            }
        }
        level = next;
    }
    Ok(connect::unary(&json!({ "entries": entries })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_use_the_proto_json_mapping() {
        let info = FileInfo {
            name: "a.txt".into(),
            path: "/home/user/a.txt".into(),
            kind: FileKind::File,
            size: 5,
            mode: 0o100644,
            modified_unix_ms: 0,
            symlink_target: None,
            uid: 0,
            gid: 1000,
        };
        let json = entry(&info);
        assert_eq!(json["type"], "FILE_TYPE_FILE");
        assert_eq!(json["path"], "/home/user/a.txt");
        assert_eq!(json["size"], "5");
        assert_eq!(json["mode"], 0o644);
        assert_eq!(json["permissions"], "-rw-r--r--");
        assert_eq!(json["modifiedTime"], "1970-01-01T00:00:00.000Z");
        assert_eq!((json["owner"].as_str(), json["group"].as_str()), (Some("root"), Some("user")));
    }
}
