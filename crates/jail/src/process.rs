//! Containing the sandboxed program itself, in the forked child of the sandbox's init, right before `execve`.
//!
//! `contain_and_exec` reads as the ordered list of steps (nsjail's `containProc`): default signal actions, the
//! owner's OOM score, session,
//! standard streams (and the controlling terminal, for a program on a pseudo-terminal), rlimits,
//! capability bounding set, unprivileged ids, remaining capabilities, no_new_privs, landlock, file descriptors,
//! working directory, seccomp (last: it also forbids the steps before it), execve.

#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use rustix::thread::{Gid, Uid};

use crate::error::{JailError, last_os_error};
use crate::rlimits::{self, ProcessRlimits};
use crate::seccomp::SandboxFilter;
use crate::{capabilities, environment, landlock};

/// Everything that confines the program, besides the namespaces and the root filesystem it already lives in.
pub struct ProcessJail<'a> {
    /// The unprivileged user inside the sandbox.
    pub uid: u32,
    /// Its group.
    pub gid: u32,
    /// Per-process rlimits.
    pub rlimits: ProcessRlimits,
    /// Directories the program may write beneath (landlock).
    pub writable_dirs: Vec<PathBuf>,
    /// Single files the program may write (landlock), e.g. /dev/null.
    pub writable_files: Vec<PathBuf>,
    /// Working directory.
    pub cwd: PathBuf,
    /// The compiled seccomp filter.
    pub filter: &'a SandboxFilter,
    /// The OOM score adjustment the program gets: the owner's own. The agent may run at -1000 (so that the OOM
    /// killer picks the program, never the reporter); that must not be inherited, or the program would be unkillable
    /// by the OOM killer and a memory bomb would spin until the timeout.
    pub oom_score_adj: i32,
}

/// The standard streams of the program.
#[derive(Debug, Clone, Copy)]
pub struct Stdio {
    /// Standard input.
    pub stdin: RawFd,
    /// Standard output.
    pub stdout: RawFd,
    /// Standard error.
    pub stderr: RawFd,
    /// Standard input is a terminal (a pseudo-terminal's slave) that becomes the program's controlling terminal,
    /// after `setsid` made it a session leader without one.
    pub controlling_terminal: bool,
}

/// A program with argv and environment converted to C strings and its path resolved.
pub struct PreparedExec {
    program: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
    display_name: String,
}

fn c_string(text: &str, what: &str) -> Result<CString, JailError> {
    CString::new(text).map_err(|_| JailError::NulByte(what.to_owned()))
}

/// Finds `program` on the sandbox's PATH (run after pivot_root, so paths are the sandbox's own).
pub fn resolve_program(program: &str) -> Result<PathBuf, JailError> {
    if program.contains('/') {
        return Ok(PathBuf::from(program));
    }
    environment::SANDBOX_PATH
        .split(':')
        .map(|dir| Path::new(dir).join(program))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| JailError::ProgramNotFound(program.to_owned()))
}

impl PreparedExec {
    /// Resolves the program on PATH and converts everything to C strings.
    pub fn new(argv: &[String], env: &BTreeMap<String, String>) -> Result<PreparedExec, JailError> {
        let first = argv.first().ok_or_else(|| JailError::ProgramNotFound(String::new()))?;
        let program = resolve_program(first)?;
        Ok(PreparedExec {
            program: c_string(&program.to_string_lossy(), "program path")?,
            argv: argv.iter().map(|arg| c_string(arg, "an argument")).collect::<Result<_, _>>()?,
            envp: env
                .iter()
                .map(|(k, v)| c_string(&format!("{k}={v}"), "an environment variable"))
                .collect::<Result<_, _>>()?,
            display_name: first.clone(),
        })
    }
}

fn prctl(option: libc::c_int, name: &'static str, arg: libc::c_ulong) -> Result<(), JailError> {
    // SAFETY: the prctl options used here take integer arguments only.
    let ret = unsafe { libc::prctl(option, arg, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong) };
    if ret != 0 {
        return Err(JailError::Prctl { option: name, source: last_os_error() });
    }
    Ok(())
}

fn connect_stdio(stdio: Stdio) -> Result<(), JailError> {
    for (from, to) in [(stdio.stdin, 0), (stdio.stdout, 1), (stdio.stderr, 2)] {
        // SAFETY: dup2 on descriptors; an invalid one makes it fail with EBADF, which is reported.
        if from != to && unsafe { libc::dup2(from, to) } < 0 {
            return Err(JailError::Dup2 { fd: to, source: last_os_error() });
        }
    }
    Ok(())
}

fn close_fds_except(keep: &[RawFd]) -> Result<(), JailError> {
    let close_range = |first: RawFd, last: libc::c_uint| -> Result<(), JailError> {
        // SAFETY: close_range(2) takes integers; closing descriptors this process no longer uses is the point.
        let ret = unsafe { libc::syscall(libc::SYS_close_range, first as libc::c_uint, last, 0 as libc::c_uint) };
        if ret != 0 {
            return Err(JailError::CloseFds(last_os_error()));
        }
        Ok(())
    };
    let mut kept: Vec<RawFd> = keep.iter().copied().filter(|fd| *fd > 2).collect();
    kept.sort_unstable();
    kept.dedup();
    let result = (|| {
        let mut next: RawFd = 3;
        for fd in &kept {
            if *fd > next {
                close_range(next, (*fd - 1) as libc::c_uint)?;
            }
            next = fd + 1;
        }
        close_range(next, libc::c_uint::MAX)
    })();
    match result {
        // gVisor has no close_range: close the open ones as /proc/self/fd lists them (each system call costs
        // microseconds there, so not every number up to the limit).
        Err(JailError::CloseFds(error)) if matches!(error.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => {
            let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
                .map_err(JailError::CloseFds)?
                .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
                .collect();
            for fd in open {
                if fd > 2 && !kept.contains(&fd) {
                    // SAFETY: closing a descriptor this process no longer uses (the listing's own descriptor is
                    // closed already: EBADF).
                    unsafe { libc::close(fd) };
                }
            }
            Ok(())
        }
        other => other,
    }
}

fn switch_ids(uid: u32, gid: u32) -> Result<(), JailError> {
    let fail = |e: rustix::io::Errno| JailError::SetIds { uid, gid, source: e.into() };
    rustix::thread::set_thread_groups(&[]).map_err(fail)?;
    let (gid_t, uid_t) = (Gid::from_raw(gid), Uid::from_raw(uid));
    rustix::thread::set_thread_res_gid(gid_t, gid_t, gid_t).map_err(fail)?;
    rustix::thread::set_thread_res_uid(uid_t, uid_t, uid_t).map_err(fail)
}

/// Confines the calling process and replaces it with the program. Returns only on failure.
///
/// `keep_fd` is a close-on-exec descriptor that survives until execve (the caller's exec-error pipe).
pub fn contain_and_exec(jail: &ProcessJail<'_>, exec: &PreparedExec, stdio: Stdio, keep_fd: RawFd) -> JailError {
    contain_and_exec_keeping(jail, exec, stdio, &[keep_fd])
}

/// `contain_and_exec` keeping every descriptor in `keep` open up to execve (and beyond, for those without
/// close-on-exec: a VMM's disks and channels, which its command line names by number).
pub fn contain_and_exec_keeping(
    jail: &ProcessJail<'_>,
    exec: &PreparedExec,
    stdio: Stdio,
    keep: &[RawFd],
) -> JailError {
    match contain(jail, stdio, keep) {
        Err(error) => error,
        Ok(()) => execve(exec),
    }
}

/// Restores every signal's default action and unblocks all signals: ignored signals survive execve, and the owner
/// (a Rust program) ignores SIGPIPE, which would change how the sandboxed program dies on a closed pipe.
fn reset_signals() {
    // The kernel's struct sigaction on x86_64: handler, flags, restorer, mask; all zero = SIG_DFL, no flags.
    let default_action = [0u64; 4];
    for signal in 1..=64 {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: rt_sigaction reads a valid, initialised kernel sigaction and writes nothing (old = null). The raw
        // call also reaches glibc's reserved real-time signals (32, 33), which an owner may have left ignored.
        unsafe {
            libc::syscall(libc::SYS_rt_sigaction, signal, default_action.as_ptr(), std::ptr::null_mut::<u64>(), 8usize)
        };
    }
    // SAFETY: an empty, initialised set; sigprocmask only reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
}

fn contain(jail: &ProcessJail<'_>, stdio: Stdio, keep: &[RawFd]) -> Result<(), JailError> {
    reset_signals();
    // The agent's id switch made this process non-dumpable, which hands /proc/self to the host's root (unmapped
    // here): make it ours again to set the OOM score. execve decides dumpability afresh for the program.
    prctl(libc::PR_SET_DUMPABLE, "PR_SET_DUMPABLE", 1)?;
    std::fs::write("/proc/self/oom_score_adj", jail.oom_score_adj.to_string())
        .map_err(|source| JailError::Prctl { option: "oom_score_adj", source })?;
    rustix::process::setsid().map_err(|e| JailError::Setsid(e.into()))?;
    connect_stdio(stdio)?;
    if stdio.controlling_terminal {
        // SAFETY: descriptor 0 is open (connect_stdio just placed it) for the duration of the call.
        let stdin = unsafe { std::os::fd::BorrowedFd::borrow_raw(0) };
        rustix::process::ioctl_tiocsctty(stdin).map_err(|e| JailError::ControllingTerminal(e.into()))?;
    }
    rlimits::apply(&jail.rlimits)?;
    capabilities::drop_bounding_and_ambient()?;
    switch_ids(jail.uid, jail.gid)?;
    capabilities::drop_remaining_and_verify()?;
    prctl(libc::PR_SET_NO_NEW_PRIVS, "PR_SET_NO_NEW_PRIVS", 1)?;
    let dirs: Vec<&Path> = jail.writable_dirs.iter().map(PathBuf::as_path).collect();
    let files: Vec<&Path> = jail.writable_files.iter().map(PathBuf::as_path).collect();
    landlock::restrict(&dirs, &files)?;
    close_fds_except(keep)?;
    rustix::process::chdir(&jail.cwd).map_err(|e| JailError::Chdir { path: jail.cwd.clone(), source: e.into() })?;
    jail.filter.apply()?;
    Ok(())
}

fn execve(exec: &PreparedExec) -> JailError {
    let mut argv: Vec<*const libc::c_char> = exec.argv.iter().map(|arg| arg.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = exec.envp.iter().map(|var| var.as_ptr()).collect();
    envp.push(std::ptr::null());
    // SAFETY: program, argv and envp are NUL-terminated strings owned by `exec`, and both arrays end with a null
    // pointer, as execve(2) requires. On success the call does not return.
    unsafe { libc::execve(exec.program.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    JailError::Exec { program: exec.display_name.clone(), source: last_os_error() }
}
