//! Namespaces: creating the sandbox's user, mount, pid, net, ipc and uts namespaces in one clone, mapping its ids to an
//! unprivileged host range, and the steps inside that make the child the namespaces' root.

#![allow(unsafe_code)]

use std::fs;
use std::io;
use std::path::PathBuf;

use rustix::thread::{Gid, Uid};

use crate::error::{JailError, last_os_error};

/// Namespaces created at clone time. The cgroup namespace is created later by the child (`enter_cgroup_namespace`),
/// after the host has moved it into its cgroup, so that the namespace's root is the sandbox's own cgroup.
pub const CLONE_NAMESPACES: i32 = libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS;

/// How many ids of the host the sandbox's user namespace maps (inside 0..count → host base..base+count).
pub const MAPPED_ID_COUNT: u32 = 65_536;

/// Who the forked side of `clone_into_namespaces` is.
pub enum CloneOutcome {
    /// We are the parent; the child's host pid.
    Parent(u32),
    /// We are the child, PID 1 of the new pid namespace.
    Child,
}

/// Sets only the effective uid of the calling thread (real and saved stay), with the raw syscall: glibc's wrapper
/// would broadcast to other threads, and there are none.
fn set_effective_uid(uid: u32) -> Result<(), JailError> {
    // SAFETY: setresuid with -1 (unchanged) for the real and saved ids; plain integers.
    let ret = unsafe { libc::syscall(libc::SYS_setresuid, -1i64, i64::from(uid), -1i64) };
    if ret != 0 {
        return Err(JailError::SetIds { uid, gid: u32::MAX, source: last_os_error() });
    }
    Ok(())
}

/// Forks into new namespaces (fork semantics: the child gets a copy of the address space and continues here).
///
/// The new user namespace is created with the effective uid `owner` (an unprivileged host uid): the kernel charges
/// per-user quotas of everything inside (inotify instances and watches, pending signals, message queues, …) to the
/// namespace's owner, so with root as owner a sandbox could exhaust root's quotas and starve host daemons. The real
/// and saved uids stay 0, so the caller regains root right after the clone.
///
/// Must be called from a single-threaded process: the child owns a copy of only the calling thread, so a lock held by
/// another thread (the allocator's, for instance) would stay locked forever in the child.
pub fn clone_into_namespaces(owner: u32) -> Result<CloneOutcome, JailError> {
    let flags = (CLONE_NAMESPACES | libc::SIGCHLD) as libc::c_ulong;
    set_effective_uid(owner)?;
    // SAFETY: raw clone without CLONE_VM and with a null stack behaves like fork(2): the child runs on a copy-on-write
    // copy of the caller's stack. The caller guarantees the process is single-threaded (documented above), so no lock
    // is left held in the child. No pointer arguments are passed.
    let ret = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    let clone_error = last_os_error();
    if ret != 0 {
        // The parent (or a failed clone) takes its root identity back; the child becomes namespace root later.
        set_effective_uid(0)?;
    }
    match ret {
        -1 => Err(JailError::Clone(clone_error)),
        0 => Ok(CloneOutcome::Child),
        pid => Ok(CloneOutcome::Parent(pid as u32)),
    }
}

/// Maps the child's user namespace ids 0..MAPPED_ID_COUNT to `host_base..`, for users and groups (run by the host).
pub fn write_id_maps(pid: u32, host_base: u32) -> Result<(), JailError> {
    let map = format!("0 {host_base} {MAPPED_ID_COUNT}\n");
    for file in ["uid_map", "gid_map"] {
        let path = PathBuf::from(format!("/proc/{pid}/{file}"));
        fs::write(&path, &map).map_err(|source| JailError::IdMap { path, source })?;
    }
    Ok(())
}

/// Inside the new user namespace: drop the host's supplementary groups and become the namespace's root (host uid
/// `base`, unprivileged on the host), keeping the namespace-scoped capabilities needed to build the sandbox.
pub fn become_namespace_root() -> Result<(), JailError> {
    let fail = |source| JailError::SetIds { uid: 0, gid: 0, source };
    rustix::thread::set_thread_groups(&[]).map_err(|e| fail(e.into()))?;
    rustix::thread::set_thread_res_gid(Gid::ROOT, Gid::ROOT, Gid::ROOT).map_err(|e| fail(e.into()))?;
    rustix::thread::set_thread_res_uid(Uid::ROOT, Uid::ROOT, Uid::ROOT).map_err(|e| fail(e.into()))?;
    Ok(())
}

/// Creates the cgroup namespace, rooted at the cgroup the process is in now.
pub fn enter_cgroup_namespace() -> Result<(), JailError> {
    // SAFETY: a new cgroup namespace changes only how this process sees cgroup paths; it shares no file descriptor
    // tables or memory with anything that could be invalidated.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWCGROUP) }
        .map_err(|e| JailError::Unshare(e.into()))
}

/// Sets the uts namespace's hostname.
pub fn set_hostname(name: &str) -> Result<(), JailError> {
    rustix::system::sethostname(name.as_bytes()).map_err(|e| JailError::SetHostname(e.into()))
}

/// Asks the kernel to SIGKILL this process when its parent dies, and fails if the parent is already gone (checked
/// only when `expected_parent` is not 0: PID 1 of a new pid namespace sees its parent as pid 0).
///
/// The kernel clears this setting whenever the process's ids change: arm it after the last id switch.
pub fn die_with_parent(expected_parent: libc::pid_t) -> Result<(), JailError> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes plain integers.
    let ret = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) };
    if ret != 0 {
        return Err(JailError::Prctl { option: "PR_SET_PDEATHSIG", source: last_os_error() });
    }
    // SAFETY: getppid has no arguments and cannot fail.
    if expected_parent != 0 && unsafe { libc::getppid() } != expected_parent {
        return Err(JailError::Prctl {
            option: "PR_SET_PDEATHSIG",
            source: io::Error::other("parent exited before the child started"),
        });
    }
    Ok(())
}
