//! SIGCHLD as a descriptor, and reaping. As PID 1 the agent inherits every orphan of the sandbox: each SIGCHLD
//! (signals coalesce) triggers `waitpid(-1, WNOHANG)` until nothing is left to collect.

#![allow(unsafe_code)]

use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::reaper::ExitStatus;

use super::errors::ServeError;

/// A non-blocking signalfd reporting SIGCHLD (which is blocked from here on).
pub struct ChildSignals {
    fd: OwnedFd,
}

impl ChildSignals {
    /// Blocks SIGCHLD, ignores SIGPIPE (a write to a command's closed stdin must be an error, not the agent's death)
    /// and opens the signalfd.
    pub fn new() -> Result<ChildSignals, ServeError> {
        // SAFETY: sigset_t is plain data initialised by sigemptyset; sigprocmask and signalfd read a valid set; the
        // new descriptor is owned by the OwnedFd; signal(SIGPIPE, SIG_IGN) installs no handler code.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGCHLD);
            if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
                return Err(ServeError::Signalfd(std::io::Error::last_os_error()));
            }
            let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
            if fd < 0 {
                return Err(ServeError::Signalfd(std::io::Error::last_os_error()));
            }
            Ok(ChildSignals { fd: OwnedFd::from_raw_fd(fd) })
        }
    }

    /// The descriptor to poll.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Consumes the pending notifications and reaps every child that has ended, returning their statuses.
    pub fn reap(&self) -> Vec<(libc::pid_t, ExitStatus)> {
        let mut info = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
        while matches!(rustix::io::read(&self.fd, &mut info), Ok(n) if n > 0) {}
        reap_all()
    }
}

/// Reaps every ended child without blocking.
pub fn reap_all() -> Vec<(libc::pid_t, ExitStatus)> {
    let mut reaped = Vec::new();
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: waitpid writes the status into a valid, owned integer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::__WALL) };
        if pid > 0 {
            reaped.push((pid, ExitStatus::from_wait_status(status)));
        } else if pid < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        } else {
            return reaped;
        }
    }
}
