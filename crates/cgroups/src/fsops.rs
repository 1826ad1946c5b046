//! Error-mapped file operations on cgroup directories and control files. Directories are only ever
//! removed with `rmdir` (never recursively), as cgroupfs requires.

use std::collections::BTreeSet;
use std::fs;
use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::CgroupError;

/// How long `remove_dir` retries while the kernel still reports the cgroup busy.
const RMDIR_RETRY: Duration = Duration::from_secs(1);
/// Pause between polls of a cgroup file.
pub(crate) const POLL: Duration = Duration::from_millis(10);

/// Reads a control file.
pub(crate) fn read(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(|source| CgroupError::Read { path: path.to_owned(), source })
}

/// Reads a control file; `None` when it does not exist.
pub(crate) fn read_optional(path: &Path) -> Result<Option<String>, CgroupError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        // ENODEV: the cgroup was removed (by another process) between opening and reading the file.
        Err(err) if err.kind() == ErrorKind::NotFound || err.raw_os_error() == Some(libc::ENODEV) => Ok(None),
        Err(source) => Err(CgroupError::Read { path: path.to_owned(), source }),
    }
}

/// Writes `value` to a control file in one write.
pub(crate) fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    fs::write(path, value).map_err(|source| CgroupError::Write {
        path: path.to_owned(),
        value: value.to_owned(),
        source,
    })
}

/// `mkdir` of one directory; fails if it exists.
pub(crate) fn create_dir(path: &Path) -> Result<(), CgroupError> {
    fs::create_dir(path).map_err(|source| CgroupError::CreateDir { path: path.to_owned(), source })
}

/// Creates each missing component of `rel` below `root` (which must exist); returns `root/rel`.
pub(crate) fn ensure_dirs(root: &Path, rel: &Path) -> Result<PathBuf, CgroupError> {
    let mut dir = root.to_owned();
    for component in rel.components() {
        dir.push(component);
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(err) if err.kind() == ErrorKind::AlreadyExists && dir.is_dir() => {}
            Err(source) => return Err(CgroupError::CreateDir { path: dir, source }),
        }
    }
    Ok(dir)
}

/// `rmdir` of one directory, once: a shared parent that still has children (EBUSY or ENOTEMPTY) is an error the
/// caller may ignore, never a reason to wait. A directory that is already gone is fine.
pub(crate) fn remove_dir_once(path: &Path) -> Result<(), CgroupError> {
    match fs::remove_dir(path) {
        Err(err) if err.kind() != ErrorKind::NotFound => {
            Err(CgroupError::RemoveDir { path: path.to_owned(), source: err })
        }
        _ => Ok(()),
    }
}

/// `rmdir` of one cgroup directory, retrying briefly while the kernel reports it busy.
/// A directory that is already gone is fine.
pub(crate) fn remove_dir(path: &Path) -> Result<(), CgroupError> {
    let deadline = Instant::now() + RMDIR_RETRY;
    let mut pause = Duration::from_micros(50);
    loop {
        match fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(err) if err.kind() == ErrorKind::NotFound => return Ok(()),
            Err(err) if err.kind() == ErrorKind::ResourceBusy && Instant::now() < deadline => {
                // Busy for a moment while the last processes finish exiting: back off from 50 µs to POLL.
                thread::sleep(pause);
                pause = (pause * 2).min(POLL);
            }
            Err(source) => {
                return Err(CgroupError::RemoveDir { path: path.to_owned(), source });
            }
        }
    }
}

/// Names of the subdirectories of `path`; empty when `path` does not exist.
pub(crate) fn subdirs(path: &Path) -> Result<BTreeSet<String>, CgroupError> {
    let read_dir_err = |source| CgroupError::ReadDir { path: path.to_owned(), source };
    let entries = match fs::read_dir(path) {
        Ok(entries) => entries,
        Err(err) if err.kind() == ErrorKind::NotFound => return Ok(BTreeSet::new()),
        Err(source) => return Err(read_dir_err(source)),
    };
    let mut names = BTreeSet::new();
    for entry in entries {
        let entry = entry.map_err(read_dir_err)?;
        let is_dir = entry.file_type().map_err(read_dir_err)?.is_dir();
        if let (true, Some(name)) = (is_dir, entry.file_name().to_str()) {
            names.insert(name.to_owned());
        }
    }
    Ok(names)
}

/// The pids listed in `<dir>/cgroup.procs`; empty when the cgroup does not exist.
pub(crate) fn read_procs(dir: &Path) -> Result<Vec<u32>, CgroupError> {
    let path = dir.join("cgroup.procs");
    let Some(text) = read_optional(&path)? else {
        return Ok(Vec::new());
    };
    text.split_whitespace()
        .map(|word| word.parse().map_err(|_| CgroupError::Parse { path: path.clone(), content: word.to_owned() }))
        .collect()
}

/// The whitespace-separated words of a file such as `cgroup.controllers`; empty when it does not exist.
pub(crate) fn read_words(path: &Path) -> Result<BTreeSet<String>, CgroupError> {
    let text = read_optional(path)?.unwrap_or_default();
    Ok(text.split_whitespace().map(|w| w.trim_start_matches('+').to_owned()).collect())
}

/// Checks `parent` (`a/b`, may be empty) and `name` (one component) and returns them as relative paths.
pub(crate) fn relative_paths(parent: &str, name: &str) -> Result<(PathBuf, PathBuf), CgroupError> {
    let parent_rel = relative_parent(parent)?;
    let invalid = |reason| CgroupError::InvalidName { name: name.to_owned(), reason };
    if name.is_empty() {
        return Err(invalid("empty"));
    }
    if name.contains('/') || name.contains('\0') {
        return Err(invalid("contains '/' or NUL"));
    }
    if name == "." || name == ".." {
        return Err(invalid("is '.' or '..'"));
    }
    let full = parent_rel.join(name);
    Ok((parent_rel, full))
}

/// Checks a parent path: relative, `/`-separated, no empty, `.` or `..` components; may be empty.
pub(crate) fn relative_parent(parent: &str) -> Result<PathBuf, CgroupError> {
    let invalid = |reason| CgroupError::InvalidName { name: parent.to_owned(), reason };
    if parent.is_empty() {
        return Ok(PathBuf::new());
    }
    if parent.contains('\0') {
        return Err(invalid("contains NUL"));
    }
    if parent.split('/').any(|part| part.is_empty() || part == "." || part == "..") {
        return Err(invalid("must be relative with no empty, '.' or '..' components"));
    }
    let path = PathBuf::from(parent);
    if path.components().all(|c| matches!(c, Component::Normal(_))) {
        Ok(path)
    } else {
        Err(invalid("must be relative with no empty, '.' or '..' components"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn names_that_escape_the_parent_are_rejected() {
        for (parent, name) in
            [("", ""), ("a", "b/c"), ("a", ".."), ("a", "."), ("/abs", "x"), ("a/../b", "x"), ("a//b", "x")]
        {
            assert!(relative_paths(parent, name).is_err(), "{parent:?} {name:?} accepted");
        }
        let (parent, full) = relative_paths("sandkasten/runs", "r1").unwrap();
        assert_eq!(parent, Path::new("sandkasten/runs"));
        assert_eq!(full, Path::new("sandkasten/runs/r1"));
        assert_eq!(relative_paths("", "r1").unwrap().1, Path::new("r1"));
    }

    #[test]
    fn ensure_dirs_creates_missing_components_only_below_an_existing_root() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ensure_dirs(tmp.path(), Path::new("a/b")).unwrap();
        assert!(dir.is_dir());
        ensure_dirs(tmp.path(), Path::new("a/b")).unwrap();
        assert!(matches!(ensure_dirs(&tmp.path().join("absent"), Path::new("a")), Err(CgroupError::CreateDir { .. })));
    }

    #[test]
    fn remove_dir_of_a_missing_dir_is_fine_and_never_recursive() {
        let tmp = tempfile::tempdir().unwrap();
        remove_dir(&tmp.path().join("gone")).unwrap();
        let full = tmp.path().join("full");
        fs::create_dir(&full).unwrap();
        fs::write(full.join("f"), "x").unwrap();
        assert!(matches!(remove_dir(&full), Err(CgroupError::RemoveDir { .. })));
        assert!(full.join("f").exists());
    }

    #[test]
    fn procs_are_parsed_and_garbage_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(read_procs(tmp.path()).unwrap().is_empty());
        fs::write(tmp.path().join("cgroup.procs"), "12\n34\n").unwrap();
        assert_eq!(read_procs(tmp.path()).unwrap(), [12, 34]);
        fs::write(tmp.path().join("cgroup.procs"), "12\nx\n").unwrap();
        assert!(matches!(read_procs(tmp.path()), Err(CgroupError::Parse { .. })));
    }
}
