//! Builds the tar of a path inside a sandbox through the runtime's `list_dir`, `read_file` and `stat`: directories
//! recursively, symlinks stored as symlink entries (never followed), regular files with their mode and mtime;
//! sockets, fifos and devices are skipped. File bytes together are bounded by `max_bytes` (413), entries by
//! `MAX_ENTRIES`. Entry names are relative to the requested path (a single file is stored under its base name).

use sandkasten_types::{FailureKind, FileInfo, FileKind};
use tar::{EntryType, Header};

use crate::api::archive::plan::MAX_ENTRIES;
use crate::api::error::ApiError;
use crate::api::extract::runtime_error;
use crate::state::AppState;

struct Packer<'a> {
    state: &'a AppState,
    id: &'a str,
    builder: tar::Builder<Vec<u8>>,
    /// File bytes still allowed.
    budget: u64,
    max_bytes: u64,
    entries: usize,
}

fn io_error(error: std::io::Error) -> ApiError {
    ApiError::internal(format!("building a tar archive: {error}"))
}

fn header(info: &FileInfo, kind: EntryType, size: u64) -> Header {
    let mut header = Header::new_gnu();
    header.set_entry_type(kind);
    header.set_size(size);
    header.set_mode(info.mode & 0o7777);
    header.set_mtime(u64::try_from(info.modified_unix_ms / 1000).unwrap_or(0));
    header.set_uid(0);
    header.set_gid(0);
    header
}

impl Packer<'_> {
    fn too_large(&self) -> ApiError {
        ApiError::payload_too_large(format!(
            "the files to archive are larger than the server's max_file_bytes of {} bytes; archive a smaller directory",
            self.max_bytes
        ))
    }

    /// Appends one entry named `name`; false when it vanished before it could be read.
    async fn add(&mut self, info: &FileInfo, name: &str) -> Result<bool, ApiError> {
        self.entries += 1;
        if self.entries > MAX_ENTRIES {
            return Err(ApiError::payload_too_large(format!("more than {MAX_ENTRIES} entries to archive")));
        }
        match info.kind {
            FileKind::File => {
                let data = match self.state.runtime().read_file(self.id, &info.path, self.budget).await {
                    Ok(data) => data,
                    Err(failure) if failure.kind == FailureKind::NotFound => return Ok(false),
                    Err(failure) if failure.kind == FailureKind::TooLarge => return Err(self.too_large()),
                    Err(failure) => return Err(runtime_error(self.state, self.id, failure).await),
                };
                self.budget = self.budget.saturating_sub(data.len() as u64);
                let mut header = header(info, EntryType::Regular, data.len() as u64);
                self.builder.append_data(&mut header, name, data.as_slice()).map_err(io_error)?;
            }
            FileKind::Dir => {
                let mut header = header(info, EntryType::Directory, 0);
                self.builder.append_data(&mut header, name, std::io::empty()).map_err(io_error)?;
            }
            FileKind::Symlink => {
                let target = info.symlink_target.as_deref().unwrap_or_default();
                let mut header = header(info, EntryType::Symlink, 0);
                // Short targets are stored byte for byte; `append_link` (a GNU long-link entry) normalises them.
                if header.set_link_name_literal(target).is_ok() {
                    self.builder.append_data(&mut header, name, std::io::empty()).map_err(io_error)?;
                } else {
                    self.builder.append_link(&mut header, name, target).map_err(io_error)?;
                }
            }
            FileKind::Other => return Ok(false),
        }
        Ok(true)
    }

    /// Appends everything beneath the directory `root`, depth first, each directory before its contents.
    async fn add_tree(&mut self, root: &str) -> Result<(), ApiError> {
        let mut pending = vec![(root.to_owned(), String::new())];
        while let Some((dir, prefix)) = pending.pop() {
            let entries = match self.state.runtime().list_dir(self.id, &dir).await {
                Ok(entries) => entries,
                Err(failure) if failure.kind == FailureKind::NotFound && !prefix.is_empty() => continue,
                Err(failure) => return Err(runtime_error(self.state, self.id, failure).await),
            };
            for info in entries {
                let name = if prefix.is_empty() { info.name.clone() } else { format!("{prefix}/{}", info.name) };
                if self.add(&info, &name).await? && info.kind == FileKind::Dir {
                    pending.push((info.path.clone(), name));
                }
            }
        }
        Ok(())
    }
}

/// The tar of `info` (already `stat`ed at `info.path`) in sandbox `id`.
pub(crate) async fn pack(state: &AppState, id: &str, info: &FileInfo, max_bytes: u64) -> Result<Vec<u8>, ApiError> {
    let mut packer =
        Packer { state, id, builder: tar::Builder::new(Vec::new()), budget: max_bytes, max_bytes, entries: 0 };
    match info.kind {
        FileKind::Dir => packer.add_tree(&info.path).await?,
        FileKind::File | FileKind::Symlink => {
            let name = if info.name.is_empty() || info.name == "/" { "file" } else { info.name.as_str() };
            if !packer.add(info, name).await? {
                return Err(ApiError::not_found(format!("{} vanished while it was archived", info.path)));
            }
        }
        FileKind::Other => {
            return Err(ApiError::bad_request(format!(
                "{} is not a regular file, directory or symlink and cannot be archived",
                info.path
            )));
        }
    }
    packer.builder.into_inner().map_err(io_error)
}
