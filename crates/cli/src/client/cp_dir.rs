//! `sandbox cp` of whole directories through the tar archive routes. Up: the local tree is packed (symlinks stored
//! as links, not followed, so the server refuses them by name) and unpacked by the server. Down: the server's tar
//! is checked whole before anything is written — only regular files, directories and symlinks, relative names
//! without `..` — then unpacked with the tar crate's `unpack_in`, which also refuses to write through a symlink.

use std::path::{Path, PathBuf};

use crate::client::commands::sandbox_path;
use crate::client::http::{Client, ClientError};

fn local_error(what: &str, path: &Path, error: std::io::Error) -> ClientError {
    ClientError::input(format!("{what} '{}' failed: {error}", path.display()))
}

/// Packs the local directory `local` and unpacks it at `path` in sandbox `id` (created if missing).
pub fn upload(client: &Client, local: &Path, id: &str, path: &str) -> Result<(), ClientError> {
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(false);
    builder.append_dir_all(".", local).map_err(|e| local_error("packing", local, e))?;
    let data = builder.into_inner().map_err(|e| local_error("packing", local, e))?;
    let query = [("path".to_owned(), path.to_owned())];
    client.put_bytes(&format!("{}/files/archive", sandbox_path(id)?), &query, &data)
}

/// Refuses an archive with any entry that is not a regular file, directory or symlink, or whose name is absolute
/// or has a `..` component. Nothing is written.
fn check(data: &[u8]) -> Result<(), ClientError> {
    let refuse = |name: &str, why: &str| ClientError::server(format!("the server's archive entry {name:?} {why}"));
    let mut archive = tar::Archive::new(data);
    let entries = archive.entries().map_err(|e| ClientError::server(format!("the server's archive: {e}")))?;
    for entry in entries {
        let entry = entry.map_err(|e| ClientError::server(format!("the server's archive is not a valid tar: {e}")))?;
        let raw = entry.path_bytes();
        let name = String::from_utf8_lossy(&raw);
        if raw.starts_with(b"/") || raw.split(|b| *b == b'/').any(|c| c == b"..") {
            return Err(refuse(&name, "leaves the destination directory"));
        }
        use tar::EntryType::{Directory, Regular, Symlink};
        if !matches!(entry.header().entry_type(), Regular | Directory | Symlink) {
            return Err(refuse(&name, "is not a regular file, directory or symlink"));
        }
    }
    Ok(())
}

/// Downloads the directory `path` of sandbox `id` into `local` (created if missing; an existing directory gets a
/// subdirectory named after the source).
pub fn download(client: &Client, id: &str, path: &str, local: &str) -> Result<(), ClientError> {
    let query = [("path".to_owned(), path.to_owned())];
    let data = client.get_bytes(&format!("{}/files/archive", sandbox_path(id)?), &query)?;
    check(&data)?;
    let mut target = PathBuf::from(local);
    if target.is_dir() {
        target.push(path.trim_end_matches('/').rsplit('/').next().unwrap_or_default());
    }
    std::fs::create_dir_all(&target).map_err(|e| local_error("creating", &target, e))?;
    let mut archive = tar::Archive::new(data.as_slice());
    let entries = archive.entries().map_err(|e| local_error("unpacking into", &target, e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| local_error("unpacking into", &target, e))?;
        let unpacked = entry.unpack_in(&target).map_err(|e| local_error("unpacking into", &target, e))?;
        if !unpacked {
            let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            return Err(ClientError::server(format!("the server's archive entry {name:?} leaves the destination")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn archive(name: &str, kind: tar::EntryType) -> Vec<u8> {
        let mut header = tar::Header::new_gnu();
        header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        header.set_entry_type(kind);
        header.set_size(0);
        header.set_mode(0o644);
        header.set_cksum();
        let mut builder = tar::Builder::new(Vec::new());
        builder.append(&header, std::io::empty()).unwrap();
        builder.into_inner().unwrap()
    }

    #[test]
    fn unsafe_entries_from_the_server_are_refused() {
        assert!(check(&archive("ok/file", tar::EntryType::Regular)).is_ok());
        assert!(check(&archive("link", tar::EntryType::Symlink)).is_ok());
        for (name, kind) in [
            ("../evil", tar::EntryType::Regular),
            ("/etc/evil", tar::EntryType::Regular),
            ("a/../../evil", tar::EntryType::Directory),
            ("hard", tar::EntryType::Link),
            ("dev", tar::EntryType::Char),
        ] {
            let error = check(&archive(name, kind)).unwrap_err();
            assert!(error.message.contains(name), "{name}: {}", error.message);
        }
    }
}
