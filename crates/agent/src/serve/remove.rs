//! `Remove`: unlink a file or symlink, remove an empty directory, or (when asked) a directory with its contents. The
//! recursion walks descriptors (`openat(dir, name, O_NOFOLLOW | O_DIRECTORY)` + `unlinkat`), never paths, so a
//! symlink inside the tree is removed and never followed, and it stays on the directory's own filesystem.

use std::os::fd::OwnedFd;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use sandkasten_types::{Failure, FailureKind};

use super::errors::sys_failure;
use super::paths::{SandboxRoot, join};

/// Deepest directory tree removed recursively (each level holds a descriptor).
const MAX_DEPTH: usize = 256;

/// Removes `path`; a non-empty directory only when `recursive`.
pub fn remove(root: &SandboxRoot, path: &str, recursive: bool) -> Result<(), Failure> {
    let (parent, name) = root.parent_of(path)?;
    let stat = rustix::fs::statat(&parent, name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| sys_failure("stat", path, e))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
        return rustix::fs::unlinkat(&parent, name.as_str(), AtFlags::empty())
            .map_err(|e| sys_failure("remove", path, e));
    }
    if recursive {
        let dir = open_subdir(&parent, &name, path)?;
        empty_directory(&dir, path, stat.st_dev, 1)?;
    }
    rustix::fs::unlinkat(&parent, name.as_str(), AtFlags::REMOVEDIR).map_err(|e| sys_failure("remove", path, e))
}

fn open_subdir(parent: &OwnedFd, name: &str, path: &str) -> Result<OwnedFd, Failure> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::openat(parent, name, flags, Mode::empty()).map_err(|e| sys_failure("open", path, e))
}

/// Removes everything inside `dir` (whose path, for messages, is `path`).
fn empty_directory(dir: &OwnedFd, path: &str, device: u64, depth: usize) -> Result<(), Failure> {
    if depth > MAX_DEPTH {
        return Err(Failure::new(
            FailureKind::Conflict,
            format!("{path}: directory tree deeper than {MAX_DEPTH} levels"),
        ));
    }
    // Entries are collected first: removing while reading the same directory stream may skip entries.
    let mut names = Vec::new();
    let mut reader = rustix::fs::Dir::read_from(dir).map_err(|e| sys_failure("list", path, e))?;
    while let Some(entry) = reader.read() {
        let entry = entry.map_err(|e| sys_failure("list", path, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != "." && name != ".." {
            names.push((name, entry.file_name().to_owned()));
        }
    }
    for (display, raw) in names {
        let child_path = join(path, &display);
        let stat = match rustix::fs::statat(dir, raw.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(Errno::NOENT) => continue,
            Err(errno) => return Err(sys_failure("stat", &child_path, errno)),
        };
        if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
            if stat.st_dev != device {
                return Err(Failure::new(FailureKind::Conflict, format!("{child_path} is a mount point")));
            }
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let child = rustix::fs::openat(dir, raw.as_c_str(), flags, Mode::empty())
                .map_err(|e| sys_failure("open", &child_path, e))?;
            empty_directory(&child, &child_path, device, depth + 1)?;
            drop(child);
            unlink(dir, &raw, AtFlags::REMOVEDIR, &child_path)?;
        } else {
            unlink(dir, &raw, AtFlags::empty(), &child_path)?;
        }
    }
    Ok(())
}

fn unlink(dir: &OwnedFd, name: &std::ffi::CStr, flags: AtFlags, path: &str) -> Result<(), Failure> {
    match rustix::fs::unlinkat(dir, name, flags) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(errno) => Err(sys_failure("remove", path, errno)),
    }
}
