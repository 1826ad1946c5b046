//! Path resolution inside the root in user space, for kernels without `openat2` (gVisor answers it with ENOSYS).
//!
//! Every component is opened with `O_PATH | O_NOFOLLOW` relative to the directory before it; a symlink is read and
//! its target resolved from the root (absolute) or from its directory (relative), `..` never climbs above the root,
//! and at most `MAX_SYMLINKS` links are followed (`ELOOP` after). Procfs links other than `/proc/self` and
//! `/proc/thread-self` are refused with `ELOOP`, as `RESOLVE_NO_MAGICLINKS` refuses magic links: following their
//! *text* is harmless, but the answer must not depend on the kernel.
//!
//! A concurrent rename may move a directory out from under a resolution in progress; `openat2` detects that and
//! this does not. That is sound only where the root is the whole visible filesystem (the agent of a tier whose
//! kernel is the sandbox's own: `/` is the root, and there is nothing outside it to reach).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

/// Most symlinks followed in one resolution (the kernel's own limit).
const MAX_SYMLINKS: usize = 40;

/// `statfs.f_type` of procfs.
const PROC_SUPER_MAGIC: i64 = 0x9fa0;

/// Opens `path` (absolute) beneath `root` with `flags`, following symlinks inside the root only.
pub fn open_beneath(root: BorrowedFd<'_>, path: &str, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
    let mut followed = 0;
    let mut stack: Vec<OwnedFd> = Vec::new();
    let mut pending: Vec<String> = components(path).into_iter().rev().collect();
    loop {
        let Some(name) = pending.pop() else {
            // The path named a directory on the stack (or the root itself): open it with the caller's flags.
            let dir = stack.last().map(|fd| fd.as_fd()).unwrap_or(root);
            return rustix::fs::openat(dir, ".", flags | OFlags::CLOEXEC, mode);
        };
        let dir = stack.last().map(|fd| fd.as_fd()).unwrap_or(root);
        if name == ".." {
            stack.pop();
            continue;
        }
        let last = pending.is_empty();
        let nofollow_last = flags.contains(OFlags::NOFOLLOW) || flags.contains(OFlags::CREATE | OFlags::EXCL);
        let link = match rustix::fs::readlinkat(dir, name.as_str(), Vec::new()) {
            Ok(target) if !(last && nofollow_last) => Some(target.to_string_lossy().into_owned()),
            Ok(_) | Err(Errno::INVAL | Errno::NOENT) => None,
            Err(errno) => return Err(errno),
        };
        if let Some(target) = link {
            if is_proc(dir) && !(stack.len() == 1 && (name == "self" || name == "thread-self")) {
                return Err(Errno::LOOP);
            }
            followed += 1;
            if followed > MAX_SYMLINKS {
                return Err(Errno::LOOP);
            }
            if target.starts_with('/') {
                stack.clear();
            }
            pending.extend(components(&target).into_iter().rev());
            continue;
        }
        if last {
            return rustix::fs::openat(dir, name.as_str(), flags | OFlags::NOFOLLOW | OFlags::CLOEXEC, mode);
        }
        let next = rustix::fs::openat(
            dir,
            name.as_str(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        stack.push(next);
    }
}

fn components(path: &str) -> Vec<String> {
    path.split('/').filter(|part| !part.is_empty() && *part != ".").map(str::to_owned).collect()
}

fn is_proc(dir: BorrowedFd<'_>) -> bool {
    rustix::fs::fstatfs(dir).is_ok_and(|stat| stat.f_type == PROC_SUPER_MAGIC)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn root_of(dir: &std::path::Path) -> OwnedFd {
        rustix::fs::open(dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).unwrap()
    }

    fn read(fd: OwnedFd) -> String {
        std::io::read_to_string(std::fs::File::from(fd)).unwrap()
    }

    #[test]
    fn symlinks_and_dot_dots_stay_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        std::fs::write(dir.path().join("a/file"), "inside").unwrap();
        symlink("/a/file", dir.path().join("absolute")).unwrap();
        symlink("../../../../a/file", dir.path().join("a/climbing")).unwrap();
        symlink("/etc/passwd", dir.path().join("host")).unwrap();
        let root = root_of(dir.path());
        for path in ["/a/file", "/absolute", "/a/climbing", "/../../a/./file"] {
            let fd = open_beneath(root.as_fd(), path, OFlags::RDONLY, Mode::empty()).unwrap();
            assert_eq!(read(fd), "inside", "{path}");
        }
        assert_eq!(open_beneath(root.as_fd(), "/host", OFlags::RDONLY, Mode::empty()).err(), Some(Errno::NOENT));
    }

    #[test]
    fn loops_and_magic_links_are_refused_and_new_files_are_created() {
        let dir = tempfile::tempdir().unwrap();
        symlink("/loop", dir.path().join("loop")).unwrap();
        let root = root_of(dir.path());
        assert_eq!(open_beneath(root.as_fd(), "/loop", OFlags::RDONLY, Mode::empty()).err(), Some(Errno::LOOP));
        let created = open_beneath(root.as_fd(), "/new", OFlags::WRONLY | OFlags::CREATE, Mode::from_raw_mode(0o600));
        assert!(created.is_ok() && dir.path().join("new").is_file());

        let slash = root_of(std::path::Path::new("/"));
        for path in ["/proc/self/root/etc", "/proc/self/cwd", "/proc/self/fd/0", "/proc/thread-self/root"] {
            assert_eq!(
                open_beneath(slash.as_fd(), path, OFlags::PATH, Mode::empty()).err(),
                Some(Errno::LOOP),
                "{path}"
            );
        }
        assert!(open_beneath(slash.as_fd(), "/proc/self/status", OFlags::RDONLY, Mode::empty()).is_ok());
    }
}
