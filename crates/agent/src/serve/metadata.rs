//! File metadata: a regular file's or directory's `user.e2b.*` extended attributes (envd's file metadata), read into
//! `FileInfo::metadata` and replaced as a whole by `SetMetadata`. Everything goes through a descriptor of the entry
//! itself (opened without following a final symlink, never blocking), so a rename or symlink swap in between cannot
//! redirect it; symlinks, fifos, sockets and devices carry no metadata (the kernel allows `user.*` attributes on
//! regular files and directories only).

use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;
use sandkasten_types::{Failure, FailureKind, FileKind, FileMetadata, METADATA_XATTR_PREFIX, check_metadata};

use super::errors::sys_failure;
use super::paths::SandboxRoot;

/// Size of the buffer for one attribute list (the kernel's largest) and for one value.
const LIST_BYTES: usize = 64 << 10;

/// Flags that open an entry for its attributes: read-only, never following a final symlink, never blocking on a fifo.
fn entry_flags() -> OFlags {
    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC
}

/// Whether the filesystem refused extended attributes as such (not this one entry).
fn unsupported(errno: Errno) -> bool {
    errno == Errno::OPNOTSUPP || errno == Errno::NOTSUP
}

/// The metadata of `fd`'s file; empty when it has none, when its filesystem keeps no user attributes, or when it
/// cannot be read (metadata is a report, never a reason for a listing to fail).
fn read_fd(fd: impl AsFd) -> FileMetadata {
    let mut names = vec![0u8; LIST_BYTES];
    let Ok(len) = rustix::fs::flistxattr(&fd, &mut names[..]) else { return FileMetadata::new() };
    let mut metadata = FileMetadata::new();
    let mut value = vec![0u8; LIST_BYTES];
    for name in names[..len].split(|b| *b == 0).filter(|name| !name.is_empty()) {
        let Some(key) = name.strip_prefix(METADATA_XATTR_PREFIX.as_bytes()) else { continue };
        let Ok(read) = rustix::fs::fgetxattr(&fd, name, &mut value[..]) else { continue };
        // Set inside the sandbox (setfattr), a value may hold any bytes: only UTF-8 is metadata.
        if let (Ok(key), Ok(text)) = (std::str::from_utf8(key), std::str::from_utf8(&value[..read])) {
            metadata.insert(key.to_owned(), text.to_owned());
        }
    }
    metadata
}

/// The metadata of the entry `name` of the directory `dir` whose kind is `kind` (empty for anything but a regular file
/// or a directory).
pub fn read_at(dir: impl AsFd, name: &str, kind: FileKind) -> FileMetadata {
    if !matches!(kind, FileKind::File | FileKind::Dir) {
        return FileMetadata::new();
    }
    match rustix::fs::openat(&dir, name, entry_flags(), Mode::empty()) {
        Ok(fd) => read_fd(fd),
        Err(_) => FileMetadata::new(),
    }
}

/// Opens `path` (resolved inside the root, a final symlink not followed) for its attributes: a regular file or a
/// directory, else `invalid_path`.
fn open_entry(root: &SandboxRoot, path: &str) -> Result<OwnedFd, Failure> {
    // A final symlink is ELOOP (`invalid_path`): a link carries no metadata.
    let fd = root.open_in_root(path, entry_flags(), Mode::empty())?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| sys_failure("stat", path, e))?;
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile | FileType::Directory => Ok(fd),
        _ => Err(Failure::new(FailureKind::InvalidPath, format!("{path} is neither a file nor a directory"))),
    }
}

/// Replaces the metadata of `path` with `metadata`: the `user.e2b.*` attributes it does not name are removed first,
/// then each of its keys is set.
pub fn set(root: &SandboxRoot, path: &str, metadata: &FileMetadata) -> Result<(), Failure> {
    check_metadata(metadata).map_err(|message| Failure::new(FailureKind::InvalidPath, message))?;
    let fd = open_entry(root, path)?;
    let refused = |errno: Errno| {
        if unsupported(errno) {
            Failure::new(
                FailureKind::InvalidPath,
                format!("the filesystem of {path} keeps no user extended attributes, so no file metadata"),
            )
        } else {
            sys_failure("setting the metadata of", path, errno)
        }
    };
    let mut names = vec![0u8; LIST_BYTES];
    let len = match rustix::fs::flistxattr(&fd, &mut names[..]) {
        Ok(len) => len,
        // Nothing to clear and nothing to set on a filesystem without attributes: done.
        Err(errno) if unsupported(errno) && metadata.is_empty() => return Ok(()),
        Err(errno) => return Err(refused(errno)),
    };
    for name in names[..len].split(|b| *b == 0) {
        let Some(key) = name.strip_prefix(METADATA_XATTR_PREFIX.as_bytes()) else { continue };
        let kept = std::str::from_utf8(key).is_ok_and(|key| metadata.contains_key(key));
        if !kept {
            match rustix::fs::fremovexattr(&fd, name) {
                Ok(()) | Err(Errno::NODATA) => {}
                Err(errno) => return Err(refused(errno)),
            }
        }
    }
    for (key, value) in metadata {
        let name = format!("{METADATA_XATTR_PREFIX}{key}");
        rustix::fs::fsetxattr(&fd, name.as_str(), value.as_bytes(), rustix::fs::XattrFlags::empty())
            .map_err(refused)?;
    }
    Ok(())
}
