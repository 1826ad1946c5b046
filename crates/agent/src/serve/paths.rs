//! Resolving sandbox paths safely: every path is resolved by the kernel with `openat2(root, path, RESOLVE_IN_ROOT |
//! RESOLVE_NO_MAGICLINKS)`, so `..` and symlinks (absolute or relative) stay inside the root and `/proc/*/root`-style
//! magic links are refused; and every operation runs with the sandbox user's filesystem identity (`setfsuid`/
//! `setfsgid`), so permissions are the sandbox user's, never the agent's — or, for `AsUser` root, the sandbox root's
//! ids with every capability out of effect, so no more than a root command could do.

#![allow(unsafe_code)]

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use sandkasten_types::{Failure, FailureKind};

use super::errors::sys_failure;

/// Longest path accepted, in bytes (PATH_MAX).
const MAX_PATH_BYTES: usize = 4096;

/// Set once `openat2` answered ENOSYS (gVisor): resolution then happens in user space (`resolve`).
static OPENAT2_MISSING: AtomicBool = AtomicBool::new(false);

/// The uid and gid whose permissions file operations get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsIdentity {
    /// Filesystem uid (the sandbox user).
    pub uid: u32,
    /// Filesystem gid.
    pub gid: u32,
}

/// The sandbox's root directory, as an `O_PATH` descriptor, and the identity file operations use.
#[derive(Debug)]
pub struct SandboxRoot {
    fd: OwnedFd,
    identity: Option<FsIdentity>,
}

impl SandboxRoot {
    /// Opens `dir` (`/` in production, after pivot_root) as the root. `identity: None` keeps the agent's own
    /// identity (tests without root).
    pub fn open(dir: &Path, identity: Option<FsIdentity>) -> std::io::Result<SandboxRoot> {
        let fd = rustix::fs::open(dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        Ok(SandboxRoot { fd, identity })
    }

    /// The sandbox user's identity, when file operations take it (`None`: the agent's own, in tests without root).
    pub fn identity(&self) -> Option<FsIdentity> {
        self.identity
    }

    /// Runs `op` with the sandbox user's filesystem identity, restoring the agent's afterwards.
    pub fn as_sandbox_user<T>(&self, op: impl FnOnce() -> Result<T, Failure>) -> Result<T, Failure> {
        let Some(identity) = self.identity else { return op() };
        let _restore = FsIdentityGuard::switch(identity)?;
        op()
    }

    /// Runs `op` as the sandbox's root: filesystem ids 0 inside the sandbox's user namespace with no capability in
    /// effect (a command run as root has none either), restoring the agent's ids and capabilities afterwards.
    pub fn as_sandbox_root<T>(&self, op: impl FnOnce() -> Result<T, Failure>) -> Result<T, Failure> {
        if self.identity.is_none() {
            return op();
        }
        let _ids = FsIdentityGuard::switch(FsIdentity { uid: 0, gid: 0 })?;
        let _capabilities = NoCapabilities::enter()?;
        op()
    }

    /// Resolves `path` inside the root and opens it with `flags` (`O_CLOEXEC` is added).
    pub fn open_in_root(&self, path: &str, flags: OFlags, mode: Mode) -> Result<OwnedFd, Failure> {
        check_path(path)?;
        let resolve = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS;
        if OPENAT2_MISSING.load(Ordering::Relaxed) {
            return super::resolve::open_beneath(self.fd.as_fd(), path, flags, mode)
                .map_err(|errno| sys_failure("open", path, errno));
        }
        // openat2 fails with EAGAIN when a concurrent rename or mount could have fooled the resolution: retry.
        let mut attempts = 0;
        loop {
            match rustix::fs::openat2(&self.fd, path, flags | OFlags::CLOEXEC, mode, resolve) {
                Err(Errno::AGAIN) if attempts < 16 => attempts += 1,
                Err(Errno::NOSYS) => {
                    OPENAT2_MISSING.store(true, Ordering::Relaxed);
                    return self.open_in_root(path, flags, mode);
                }
                Err(errno) => return Err(sys_failure("open", path, errno)),
                Ok(fd) => return Ok(fd),
            }
        }
    }

    /// The directory holding `path` (resolved inside the root, `O_PATH`) and the last component's name. The name is
    /// never empty, `.` or `..`.
    pub fn parent_of(&self, path: &str) -> Result<(OwnedFd, String), Failure> {
        let (parent, name) = split_parent(path)?;
        let dir = self.open_in_root(parent, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
        Ok((dir, name.to_owned()))
    }

    /// The root descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Refuses relative paths, NUL bytes and overlong paths before the kernel sees them.
pub fn check_path(path: &str) -> Result<(), Failure> {
    if !path.starts_with('/') {
        return Err(Failure::new(FailureKind::InvalidPath, format!("{path:?} is not an absolute path")));
    }
    if path.contains('\0') || path.len() > MAX_PATH_BYTES {
        return Err(Failure::new(FailureKind::InvalidPath, "the path contains NUL or is too long"));
    }
    Ok(())
}

/// Splits an absolute path into its parent and last component (trailing slashes ignored).
pub fn split_parent(path: &str) -> Result<(&str, &str), Failure> {
    check_path(path)?;
    let trimmed = path.trim_end_matches('/');
    let (parent, name) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
    if name.is_empty() || name == "." || name == ".." {
        return Err(Failure::new(FailureKind::InvalidPath, format!("{path:?} does not name an entry of a directory")));
    }
    Ok((if parent.is_empty() { "/" } else { parent }, name))
}

/// Joins a directory path as the host wrote it and an entry name, for display.
pub fn join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

/// This thread's effective capabilities cleared (its permitted ones kept), restored when dropped.
struct NoCapabilities {
    saved: rustix::thread::CapabilitySets,
}

impl NoCapabilities {
    fn enter() -> Result<NoCapabilities, Failure> {
        use rustix::thread::{CapabilitySet, CapabilitySets, capabilities, set_capabilities};
        let failed = |step: &str, errno: Errno| {
            Failure::new(
                FailureKind::Internal,
                format!("{step} the agent's capabilities for the sandbox's root: {errno}"),
            )
        };
        let saved = capabilities(None).map_err(|errno| failed("reading", errno))?;
        let none = CapabilitySets { effective: CapabilitySet::empty(), ..saved };
        set_capabilities(None, none).map_err(|errno| failed("clearing", errno))?;
        let guard = NoCapabilities { saved };
        match capabilities(None) {
            Ok(now) if now.effective.is_empty() => Ok(guard),
            Ok(_) => Err(Failure::new(FailureKind::Internal, "the agent's capabilities did not clear")),
            Err(errno) => Err(failed("checking", errno)),
        }
    }
}

impl Drop for NoCapabilities {
    fn drop(&mut self) {
        // The permitted set was kept, so the effective one may be raised back to what it was.
        let _ = rustix::thread::set_capabilities(None, self.saved);
    }
}

/// Restores the previous filesystem ids when dropped.
enum FsIdentityGuard {
    /// `setfsuid`/`setfsgid` switched (the host kernel).
    Fs { previous_uid: u32, previous_gid: u32 },
    /// The effective ids switched, the real and saved ids staying the agent's (kernels where `setfsuid` changes
    /// nothing, such as gVisor's; the agent is single-threaded, so this affects no other thread).
    Effective { previous_uid: u32, previous_gid: u32 },
}

/// Set once `setfsuid` was seen to change nothing: identity switches then use the effective ids.
static SETFSUID_IGNORED: AtomicBool = AtomicBool::new(false);

impl FsIdentityGuard {
    fn switch(identity: FsIdentity) -> Result<FsIdentityGuard, Failure> {
        if SETFSUID_IGNORED.load(Ordering::Relaxed) {
            return Self::switch_effective(identity);
        }
        // SAFETY: setfsgid/setfsuid take integers and only change this (single) thread's filesystem ids. Passing
        // u32::MAX (an invalid id) changes nothing and returns the current id, which verifies each switch.
        let (previous_gid, current_gid) =
            unsafe { (libc::setfsgid(identity.gid) as u32, libc::setfsgid(u32::MAX) as u32) };
        // SAFETY: as above.
        let (previous_uid, current_uid) =
            unsafe { (libc::setfsuid(identity.uid) as u32, libc::setfsuid(u32::MAX) as u32) };
        let guard = FsIdentityGuard::Fs { previous_uid, previous_gid };
        if current_gid != identity.gid || current_uid != identity.uid {
            drop(guard);
            SETFSUID_IGNORED.store(true, Ordering::Relaxed);
            return Self::switch_effective(identity);
        }
        Ok(guard)
    }

    fn switch_effective(identity: FsIdentity) -> Result<FsIdentityGuard, Failure> {
        let failed = || Failure::new(FailureKind::Internal, "could not take the sandbox user's identity");
        let (previous_uid, previous_gid) = (rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw());
        // SAFETY: raw setresgid/setresuid (-1 = unchanged) on this single-threaded process; glibc's wrappers would
        // also be fine here, the raw calls make explicit that only this thread's ids change.
        let ok = unsafe {
            libc::syscall(libc::SYS_setresgid, -1i64, identity.gid as i64, -1i64) == 0
                && libc::syscall(libc::SYS_setresuid, -1i64, identity.uid as i64, -1i64) == 0
        };
        let guard = FsIdentityGuard::Effective { previous_uid, previous_gid };
        if !ok || rustix::process::geteuid().as_raw() != identity.uid {
            return Err(failed());
        }
        Ok(guard)
    }
}

impl Drop for FsIdentityGuard {
    fn drop(&mut self) {
        match *self {
            // SAFETY: restores the ids returned by the switch; integers only.
            FsIdentityGuard::Fs { previous_uid, previous_gid } => unsafe {
                libc::setfsuid(previous_uid);
                libc::setfsgid(previous_gid);
            },
            // SAFETY: the saved uid is still the agent's, so the effective ids may return to it; uid first (it
            // restores the capability to change the gid).
            FsIdentityGuard::Effective { previous_uid, previous_gid } => unsafe {
                libc::syscall(libc::SYS_setresuid, -1i64, previous_uid as i64, -1i64);
                libc::syscall(libc::SYS_setresgid, -1i64, previous_gid as i64, -1i64);
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_and_names_are_split_and_dot_names_refused() {
        assert_eq!(split_parent("/a/b/").ok(), Some(("/a", "b")));
        assert_eq!(split_parent("/a").ok(), Some(("/", "a")));
        for bad in ["/", "a/b", "/a/..", "/.", "/a\0b"] {
            assert!(split_parent(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn magic_links_are_refused_even_when_their_target_is_inside_the_root() {
        let Ok(root) = SandboxRoot::open(Path::new("/"), None) else { return };
        for path in ["/proc/self/root/etc", "/proc/self/cwd", "/proc/self/fd/0", "/proc/thread-self/root"] {
            let result = root.open_in_root(path, OFlags::PATH, Mode::empty());
            assert_eq!(result.err().map(|e| e.kind), Some(FailureKind::InvalidPath), "{path}");
        }
        assert!(root.open_in_root("/proc/self/status", OFlags::RDONLY, Mode::empty()).is_ok());
    }
}
