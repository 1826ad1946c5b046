//! envd's `EntryInfo` of a sandbox path, as envd reports it: from `lstat` of the path, except that a symlink's `type`
//! and `mode` are its final target's (`FILE_TYPE_UNSPECIFIED` and 0 when the link dangles), `symlinkTarget` is that
//! target's absolute path with every link of the chain resolved (the link's own path when it cannot be resolved),
//! `permissions` stays the link's own (`Lrwxrwxrwx`) and `isSymlink` marks the link (newer envd's field, which the SDK
//! reads to report the entry as `FileType.SYMLINK`; older SDKs read the target's type). Also `ListDir`'s walk: depth first in name order, each
//! directory's entries right after it, into at most `depth` levels, never through a symlinked directory (envd's
//! `filepath.WalkDir`). A file's or directory's user metadata (`user.e2b.*` attributes) is its `metadata` map, left out
//! when it has none, as envd leaves it out.

use sandkasten_types::{CommandUser, FailureKind, FileInfo, FileKind};
use serde_json::{Value, json};

use crate::clock::rfc3339;
use crate::e2b::auth::runtime_failure;
use crate::e2b::error::{Code, E2bError};
use crate::state::AppState;

/// Links followed before a chain counts as a loop (Linux's `ELOOP` limit).
const MAX_LINKS: usize = 40;
/// Most entries one `ListDir` answers.
const MAX_ENTRIES: usize = 10_000;

/// Where a symlink leads, once resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LinkTarget {
    /// The absolute path every link of the chain resolves to.
    path: String,
    /// What is there; `None`: nothing (the link dangles, or loops).
    info: Option<FileInfo>,
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

fn type_name(kind: FileKind) -> &'static str {
    match kind {
        FileKind::File => "FILE_TYPE_FILE",
        FileKind::Dir => "FILE_TYPE_DIRECTORY",
        FileKind::Symlink => "FILE_TYPE_SYMLINK",
        FileKind::Other => "FILE_TYPE_UNSPECIFIED",
    }
}

/// envd's `EntryInfo` (proto3 JSON mapping) of `info`, with `link` where `info` is a symlink.
fn entry_json(info: &FileInfo, link: Option<&LinkTarget>) -> Value {
    let (kind, mode) = match link {
        None => (type_name(info.kind), info.mode & 0o7777),
        Some(LinkTarget { info: Some(target), .. }) => (type_name(target.kind), target.mode & 0o777),
        Some(LinkTarget { info: None, .. }) => ("FILE_TYPE_UNSPECIFIED", 0),
    };
    let mut entry = json!({
        "name": info.name,
        "type": kind,
        "path": info.path,
        "size": info.size.to_string(),
        "mode": mode,
        "permissions": permissions(info.kind, info.mode),
        "owner": name_of(info.uid),
        "group": name_of(info.gid),
        "modifiedTime": rfc3339(info.modified_unix_ms),
    });
    if let (Some(link), Some(object)) = (link, entry.as_object_mut()) {
        object.insert("symlinkTarget".into(), Value::String(link.path.clone()));
        object.insert("isSymlink".into(), Value::Bool(true));
    }
    if let (false, Some(object)) = (info.metadata.is_empty(), entry.as_object_mut()) {
        object.insert("metadata".into(), json!(info.metadata));
    }
    entry
}

/// `path` with `.`, `..` and repeated slashes resolved lexically (`..` of `/` is `/`).
fn normalized(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            name => parts.push(name),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Where the symlink `info` leads: each link's target read against its own directory, until a non-link (or nothing).
async fn resolve(state: &AppState, id: &str, info: &FileInfo, user: CommandUser) -> Result<LinkTarget, E2bError> {
    let mut path = info.path.clone();
    let mut current = info.clone();
    for _ in 0..MAX_LINKS {
        if current.kind != FileKind::Symlink {
            return Ok(LinkTarget { path, info: Some(current) });
        }
        let Some(target) = current.symlink_target.as_deref() else { break };
        let parent = path.rsplit_once('/').map_or("", |(parent, _)| parent);
        path = normalized(&if target.starts_with('/') { target.to_owned() } else { format!("{parent}/{target}") });
        current = match state.runtime().stat_as(id, &path, user).await {
            Ok(next) => next,
            Err(failure) if failure.kind == FailureKind::NotFound => break,
            Err(failure) => return Err(runtime_failure(state, id, failure).await),
        };
    }
    // Dangling or looping: envd names the link itself.
    Ok(LinkTarget { path: info.path.clone(), info: None })
}

/// envd's `EntryInfo` of `info` (a symlink's target resolved in the sandbox `id`, as `user`).
pub(crate) async fn entry(state: &AppState, id: &str, info: &FileInfo, user: CommandUser) -> Result<Value, E2bError> {
    if info.kind != FileKind::Symlink {
        return Ok(entry_json(info, None));
    }
    let link = resolve(state, id, info, user).await?;
    Ok(entry_json(info, Some(&link)))
}

/// The entries under the directory `root` (already resolved) into `depth` levels, in envd's walk order, as `user`.
pub(crate) async fn walk(
    state: &AppState,
    id: &str,
    root: &str,
    depth: u32,
    user: CommandUser,
) -> Result<Vec<Value>, E2bError> {
    let listed = |dir: String| async move {
        match state.runtime().list_dir_as(id, &dir, user).await {
            Ok(children) => Ok(children),
            // Removed since its parent was listed: skipped, as envd skips entries that vanished.
            Err(failure) if failure.kind == FailureKind::NotFound => Ok(Vec::new()),
            Err(failure) => Err(runtime_failure(state, id, failure).await),
        }
    };
    let mut entries = Vec::new();
    // A stack of (entry, its level), the next to emit on top; each directory's children go on above it.
    let mut pending: Vec<(FileInfo, u32)> = listed(root.to_owned()).await?.into_iter().rev().map(|i| (i, 1)).collect();
    while let Some((info, level)) = pending.pop() {
        entries.push(entry(state, id, &info, user).await?);
        if entries.len() > MAX_ENTRIES {
            return Err(E2bError::new(
                Code::ResourceExhausted,
                format!("more than {MAX_ENTRIES} entries: list with a smaller depth"),
            ));
        }
        if info.kind == FileKind::Dir && level < depth {
            let children = listed(info.path.clone()).await?;
            pending.extend(children.into_iter().rev().map(|child| (child, level + 1)));
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, kind: FileKind, mode: u32) -> FileInfo {
        FileInfo {
            name: name.into(),
            path: format!("/home/user/{name}"),
            kind,
            size: 5,
            mode,
            modified_unix_ms: 0,
            symlink_target: None,
            uid: 0,
            gid: 1000,
            metadata: Default::default(),
        }
    }

    #[test]
    fn entries_use_the_proto_json_mapping() {
        let json = entry_json(&info("a.txt", FileKind::File, 0o100644), None);
        assert_eq!(json["type"], "FILE_TYPE_FILE");
        assert_eq!(json["path"], "/home/user/a.txt");
        assert_eq!(json["size"], "5");
        assert_eq!(json["mode"], 0o644);
        assert_eq!(json["permissions"], "-rw-r--r--");
        assert_eq!(json["modifiedTime"], "1970-01-01T00:00:00.000Z");
        assert_eq!((json["owner"].as_str(), json["group"].as_str()), (Some("root"), Some("user")));
        assert!(json.get("symlinkTarget").is_none() && json.get("isSymlink").is_none());
    }

    #[test]
    fn a_symlink_has_its_target_s_type_and_mode_and_its_own_permissions() {
        let link = info("link", FileKind::Symlink, 0o777);
        let target = LinkTarget { path: "/home/user/dir".into(), info: Some(info("dir", FileKind::Dir, 0o750)) };
        let json = entry_json(&link, Some(&target));
        assert_eq!((json["type"].as_str(), json["mode"].as_u64()), (Some("FILE_TYPE_DIRECTORY"), Some(0o750)));
        assert_eq!(
            (json["permissions"].as_str(), json["symlinkTarget"].as_str()),
            (Some("Lrwxrwxrwx"), Some("/home/user/dir"))
        );
        let dangling = LinkTarget { path: "/home/user/link".into(), info: None };
        let json = entry_json(&link, Some(&dangling));
        assert_eq!((json["type"].as_str(), json["mode"].as_u64()), (Some("FILE_TYPE_UNSPECIFIED"), Some(0)));
        assert_eq!(
            (json["symlinkTarget"].as_str(), json["isSymlink"].as_bool()),
            (Some("/home/user/link"), Some(true))
        );
    }

    #[test]
    fn link_targets_are_resolved_lexically() {
        assert_eq!(normalized("/home/user/a/../b/./c"), "/home/user/b/c");
        assert_eq!(normalized("/../../etc//passwd"), "/etc/passwd");
        assert_eq!(normalized("/"), "/");
    }
}
