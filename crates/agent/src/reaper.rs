//! Reaping: as PID 1, the agent inherits every orphan of the sandbox and must wait for all of them.

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

    /// True for a normal exit with code 0.
    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
    }
}

/// Reaps children until `pid` ends and returns its status. Other children (orphans re-parented to PID 1) are reaped
/// and forgotten as they end.
pub fn wait_for(pid: libc::pid_t) -> ExitStatus {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: waitpid writes the status into a valid, owned integer.
        let reaped = unsafe { libc::waitpid(-1, &mut status, 0) };
        if reaped == pid {
            return ExitStatus::from_wait_status(status);
        }
        if reaped < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            // ECHILD: the child is gone without a status we could collect; report it as killed.
            return ExitStatus { exit_code: None, signal: Some(libc::SIGKILL) };
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
