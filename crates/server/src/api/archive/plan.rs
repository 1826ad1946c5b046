//! Checks an uploaded tar archive completely, before anything is written, and turns it into a plan: the directories
//! to create and the files to write, relative to the target directory. Only regular files and directories are
//! accepted; absolute names, `..`, NUL, non-UTF-8 and over-long names, links (symbolic and hard), devices, fifos,
//! sparse files, compressed archives, truncated archives, too many entries and too many bytes are refused with an
//! error naming the first bad entry.

use std::collections::{BTreeMap, HashMap};

use tar::EntryType;

use crate::api::error::ApiError;
use crate::validate::MAX_PATH_BYTES;

/// Most entries accepted in one archive (uploaded or downloaded).
pub(crate) const MAX_ENTRIES: usize = 100_000;

/// A file to write: where its bytes are in the archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileSlice {
    /// Offset of the first byte in the archive.
    pub(crate) offset: usize,
    /// Length in bytes.
    pub(crate) len: usize,
}

/// What extracting an archive will do, paths relative to the target directory (no leading `/`).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Directories, declared or implied by a deeper entry; a parent always sorts before its children.
    pub(crate) dirs: Vec<String>,
    /// Files (the last of several entries with the same name wins, as with `tar -x`).
    pub(crate) files: BTreeMap<String, FileSlice>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
}

fn bad(name: &str, what: &str) -> ApiError {
    ApiError::bad_request(format!("archive entry {name:?} {what}; nothing was extracted"))
}

/// The compression a body starts with, if any (only plain tar is accepted).
fn compression(archive: &[u8]) -> Option<&'static str> {
    let magic: [(&[u8], &str); 4] = [
        (&[0x1f, 0x8b], "gzip"),
        (&[0x28, 0xb5, 0x2f, 0xfd], "zstd"),
        (&[0xfd, b'7', b'z', b'X', b'Z', 0], "xz"),
        (b"BZh", "bzip2"),
    ];
    magic.iter().find(|(prefix, _)| archive.starts_with(prefix)).map(|(_, name)| *name)
}

/// The entry's path relative to the target: `.` and empty components dropped; refused when absolute, with `..`,
/// NUL, not UTF-8 or longer than 4096 bytes.
fn relative(raw: &[u8], shown: &str) -> Result<String, ApiError> {
    if raw.contains(&0) {
        return Err(bad(shown, "contains a NUL byte"));
    }
    let text = std::str::from_utf8(raw).map_err(|_| bad(shown, "is not valid UTF-8"))?;
    if text.len() > MAX_PATH_BYTES {
        return Err(bad(shown, &format!("is {} bytes long; the limit is {MAX_PATH_BYTES}", text.len())));
    }
    if text.starts_with('/') {
        return Err(bad(shown, "is an absolute path; entries must be relative to the target directory"));
    }
    let components: Vec<&str> = text.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    if components.contains(&"..") {
        return Err(bad(shown, "contains '..'; entries must stay inside the target directory"));
    }
    Ok(components.join("/"))
}

/// Refuses every entry type but regular files and directories; `None` for entries that carry no file (a pax
/// global header).
fn kind(entry_type: EntryType, shown: &str) -> Result<Option<Kind>, ApiError> {
    match entry_type {
        EntryType::Regular | EntryType::Continuous => Ok(Some(Kind::File)),
        EntryType::Directory => Ok(Some(Kind::Dir)),
        EntryType::XGlobalHeader => Ok(None),
        EntryType::Symlink => Err(bad(shown, "is a symbolic link; links are not supported in archive uploads")),
        EntryType::Link => Err(bad(shown, "is a hard link; links are not supported in archive uploads")),
        EntryType::Char | EntryType::Block | EntryType::Fifo => {
            Err(bad(shown, "is a device or fifo; only regular files and directories are accepted"))
        }
        EntryType::GNUSparse => Err(bad(shown, "is a sparse file; only regular files and directories are accepted")),
        other => Err(bad(shown, &format!("has the unsupported type {:?}", other.as_byte() as char))),
    }
}

/// Checks the whole archive and returns its plan. `target` is the absolute directory it unpacks into (for the
/// length check); `max_bytes` bounds the unpacked size (413 beyond it, as is more than `MAX_ENTRIES` entries).
pub(crate) fn plan(archive: &[u8], target: &str, max_bytes: u64) -> Result<Plan, ApiError> {
    if let Some(name) = compression(archive) {
        return Err(ApiError::bad_request(format!(
            "the archive is {name}-compressed; only plain (uncompressed) tar is accepted: decompress it first"
        )));
    }
    let mut kinds: HashMap<String, Kind> = HashMap::new();
    let mut plan = Plan::default();
    let mut unpacked: u64 = 0;
    let mut count = 0usize;
    let mut reader = tar::Archive::new(archive);
    let entries = reader.entries().map_err(|e| ApiError::bad_request(format!("the body is not a tar archive: {e}")))?;
    for entry in entries {
        let entry = entry.map_err(|e| {
            ApiError::bad_request(format!("the body is not a valid tar archive (after {count} entries): {e}"))
        })?;
        count += 1;
        if count > MAX_ENTRIES {
            return Err(ApiError::payload_too_large(format!("the archive has more than {MAX_ENTRIES} entries")));
        }
        let raw = entry.path_bytes();
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let rel = relative(&raw, &shown)?;
        let Some(kind) = kind(entry.header().entry_type(), &shown)? else { continue };
        if target.len() + 1 + rel.len() > MAX_PATH_BYTES {
            return Err(bad(&shown, &format!("is longer than {MAX_PATH_BYTES} bytes once under {target}")));
        }
        if rel.is_empty() {
            if kind == Kind::Dir {
                continue; // `./`: the target itself
            }
            return Err(bad(&shown, "is a file without a name"));
        }
        for (at, _) in rel.match_indices('/') {
            let parent = &rel[..at];
            match kinds.get(parent) {
                Some(Kind::File) => return Err(bad(&shown, &format!("is inside {parent:?}, a file of the archive"))),
                Some(Kind::Dir) => {}
                None => {
                    kinds.insert(parent.to_owned(), Kind::Dir);
                }
            }
        }
        match (kinds.get(&rel), kind) {
            (Some(Kind::Dir), Kind::File) => {
                return Err(bad(&shown, "is a file, but the archive also makes it a directory"));
            }
            (Some(Kind::File), Kind::Dir) => {
                return Err(bad(&shown, "is a directory, but the archive also makes it a file"));
            }
            _ => {}
        }
        kinds.insert(rel.clone(), kind);
        if kind == Kind::File {
            let size = entry.size();
            unpacked = unpacked.saturating_add(size);
            if unpacked > max_bytes {
                return Err(ApiError::payload_too_large(format!(
                    "the archive unpacks to more than the limit of {max_bytes} bytes (at entry {shown:?})"
                )));
            }
            let offset = usize::try_from(entry.raw_file_position()).unwrap_or(usize::MAX);
            let len = usize::try_from(size).unwrap_or(usize::MAX);
            if offset.checked_add(len).is_none_or(|end| end > archive.len()) {
                return Err(bad(&shown, "is cut short: the archive is truncated"));
            }
            plan.files.insert(rel, FileSlice { offset, len });
        }
    }
    let mut dirs: Vec<String> =
        kinds.into_iter().filter(|(_, kind)| *kind == Kind::Dir).map(|(path, _)| path).collect();
    dirs.sort();
    plan.dirs = dirs;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn header(kind: EntryType, size: u64) -> tar::Header {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_size(size);
        header.set_mode(0o644);
        header
    }

    /// An archive with raw names (the tar crate's builder refuses `..` and absolute names, so they are written
    /// into the header directly).
    fn archive(entries: &[(&str, EntryType, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (name, kind, data) in entries {
            let mut header = header(*kind, data.len() as u64);
            let bytes = name.as_bytes();
            header.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
            if *kind == EntryType::Symlink || *kind == EntryType::Link {
                header.set_link_name("/etc").unwrap();
            }
            header.set_cksum();
            builder.append(&header, *data).unwrap();
        }
        builder.into_inner().unwrap()
    }

    #[test]
    fn files_and_implied_directories_are_planned() {
        let tar = archive(&[
            ("./", EntryType::Directory, b""),
            ("./a/b/c.txt", EntryType::Regular, b"hello"),
            ("d/", EntryType::Directory, b""),
            ("a/b/c.txt", EntryType::Regular, b"again"),
        ]);
        let plan = plan(&tar, "/workspace", 1 << 20).unwrap();
        assert_eq!(plan.dirs, ["a", "a/b", "d"]);
        let slice = plan.files["a/b/c.txt"];
        assert_eq!(&tar[slice.offset..slice.offset + slice.len], b"again");
        assert_eq!(plan.files.len(), 1);
    }

    #[test]
    fn escaping_and_special_entries_are_refused_by_name() {
        for (name, kind, why) in [
            ("../evil", EntryType::Regular, "'..'"),
            ("a/../../evil", EntryType::Regular, "'..'"),
            ("/etc/evil", EntryType::Regular, "absolute"),
            ("link", EntryType::Symlink, "symbolic link"),
            ("hard", EntryType::Link, "hard link"),
            ("null", EntryType::Char, "device"),
            ("disk", EntryType::Block, "device"),
            ("pipe", EntryType::Fifo, "fifo"),
        ] {
            let tar = archive(&[("ok.txt", EntryType::Regular, b"x"), (name, kind, b"")]);
            let error = plan(&tar, "/workspace", 1 << 20).unwrap_err();
            assert_eq!(error.code, crate::api::error::ErrorCode::BadRequest, "{name}");
            assert!(error.message.contains(name) && error.message.contains(why), "{name}: {}", error.message);
        }
    }

    #[test]
    fn conflicting_kinds_sizes_and_compression_are_refused() {
        let nested = archive(&[("f", EntryType::Regular, b"x"), ("f/g", EntryType::Regular, b"y")]);
        assert!(plan(&nested, "/w", 100).unwrap_err().message.contains("a file of the archive"));
        let big = archive(&[("a", EntryType::Regular, &[0; 60]), ("b", EntryType::Regular, &[0; 60])]);
        assert_eq!(plan(&big, "/w", 100).unwrap_err().code, crate::api::error::ErrorCode::PayloadTooLarge);
        let mut truncated = archive(&[("a", EntryType::Regular, &[7; 2000])]);
        truncated.truncate(1024);
        assert!(plan(&truncated, "/w", 1 << 20).is_err());
        assert!(plan(&[0x1f, 0x8b, 8, 0], "/w", 100).unwrap_err().message.contains("gzip"));
        assert!(plan(&[1u8; 700], "/w", 100).is_err());
        assert_eq!(plan(b"", "/w", 100).unwrap(), Plan::default());
    }
}
