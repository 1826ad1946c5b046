//! Reaping: how a process ended, and reaping a child that failed to start (the serve loop reaps everything else).

#![allow(unsafe_code)]

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitStatus {
    /// Exit code when it exited normally.
    pub exit_code: Option<i32>,
    /// Signal number when a signal killed it.
    pub signal: Option<i32>,
}

impl ExitStatus {
    pub(crate) fn from_wait_status(status: libc::c_int) -> Self {
        if libc::WIFEXITED(status) {
            ExitStatus { exit_code: Some(libc::WEXITSTATUS(status)), signal: None }
        } else {
            ExitStatus { exit_code: None, signal: Some(libc::WTERMSIG(status)) }
        }
    }
}

/// Reaps exactly `pid` (a child that failed to start), leaving every other child's status to its owner.
pub fn wait_for_child(pid: libc::pid_t) {
    let mut status: libc::c_int = 0;
    // SAFETY: waitpid writes the status into a valid, owned integer.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
    {}
}
