//! Running one program (the compile step or the program itself) through the jail, with exec failures reported back
//! through a close-on-exec pipe: EOF without data means execve succeeded.

#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};

use sandkasten_jail::JailError;
use sandkasten_jail::process::{PreparedExec, ProcessJail, Stdio, contain_and_exec};

/// A started program, or why it could not start.
pub enum Started {
    /// execve succeeded; the program's pid.
    Running(libc::pid_t),
    /// It could not start; the message says why (already formatted for the user).
    Failed(String),
}

/// Forks, confines the child and executes `argv` in it.
pub fn start(jail: &ProcessJail<'_>, argv: &[String], env: &BTreeMap<String, String>, stdio: Stdio) -> Started {
    let (error_read, error_write) = match rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC) {
        Ok(pair) => pair,
        Err(e) => return Started::Failed(format!("creating the exec-error pipe failed: {e}")),
    };
    // SAFETY: the agent is single-threaded (it is the forked child of a single-threaded host), so the child may
    // continue to run Rust code, including allocation.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Started::Failed(format!("fork failed: {}", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        drop(error_read);
        let error = match PreparedExec::new(argv, env) {
            Ok(exec) => contain_and_exec(jail, &exec, stdio, error_write.as_raw_fd()),
            Err(error) => error,
        };
        let code = match error {
            JailError::ProgramNotFound(_) => 127,
            _ => 126,
        };
        let mut pipe = File::from(error_write);
        let _ = pipe.write_all(error.to_string().as_bytes());
        // SAFETY: _exit ends the forked child without running the parent's atexit handlers or destructors.
        unsafe { libc::_exit(code) };
    }
    drop(error_write);
    read_exec_outcome(error_read, pid)
}

fn read_exec_outcome(error_read: OwnedFd, pid: libc::pid_t) -> Started {
    let mut message = String::new();
    let mut pipe = File::from(error_read);
    match pipe.read_to_string(&mut message) {
        Ok(0) => Started::Running(pid),
        Ok(_) => {
            // Only this child: in serve mode other commands' statuses must stay for the serve loop to collect.
            crate::reaper::wait_for_child(pid);
            Started::Failed(message)
        }
        Err(e) => Started::Failed(format!("reading the exec-error pipe failed: {e}")),
    }
}
