//! How serve mode starts a command: behind the `Launcher` trait, so the whole loop can be tested with a plain
//! fork + exec (no namespaces, no root) while production goes through the jail (`step::start` →
//! `contain_and_exec`: fork, setsid, ids, capabilities, landlock, seccomp, execve).

use std::collections::BTreeMap;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;

use sandkasten_jail::process::{ProcessJail, Stdio};

use crate::step::{self, Started};

/// One command to start, prepared by the loop.
pub struct LaunchRequest<'a> {
    /// Program and arguments (the program is looked up on the sandbox's PATH).
    pub argv: &'a [String],
    /// The complete environment.
    pub env: &'a BTreeMap<String, String>,
    /// Working directory as a sandbox path (already checked to be a directory inside the root).
    pub cwd_path: &'a str,
    /// The same directory, resolved inside the root (`O_PATH`).
    pub cwd: BorrowedFd<'a>,
    /// The command's standard streams (pipe ends the launcher's child takes as 0, 1, 2).
    pub stdio: Stdio,
    /// Run as the sandbox's root (uid and gid 0 inside, no capabilities) instead of the sandbox user.
    pub as_root: bool,
}

/// Starts commands. The child must start a new session (`setsid`: its pid is its process group), take `stdio` as
/// its standard streams, close every other descriptor, reset its signal mask and dispositions, and exec. `launch`
/// returns once `execve` succeeded (the child's pid) or failed (a message for the user; the child is reaped).
pub trait Launcher {
    /// Starts one command.
    fn launch(&self, request: &LaunchRequest<'_>) -> Result<libc::pid_t, String>;
}

/// The production launcher: every command goes through the sandbox's jail.
pub struct JailLauncher<'a> {
    jail: &'a ProcessJail<'a>,
}

impl<'a> JailLauncher<'a> {
    /// Launches through `jail` (its `cwd` is replaced by each command's own).
    pub fn new(jail: &'a ProcessJail<'a>) -> Self {
        JailLauncher { jail }
    }
}

impl Launcher for JailLauncher<'_> {
    fn launch(&self, request: &LaunchRequest<'_>) -> Result<libc::pid_t, String> {
        // The sandbox's root is only an id: `contain` drops every capability and sets no_new_privs either way.
        let (uid, gid) = if request.as_root { (0, 0) } else { (self.jail.uid, self.jail.gid) };
        let jail = ProcessJail {
            uid,
            gid,
            rlimits: self.jail.rlimits,
            writable_dirs: self.jail.writable_dirs.clone(),
            writable_files: self.jail.writable_files.clone(),
            cwd: PathBuf::from(request.cwd_path),
            filter: self.jail.filter,
            oom_score_adj: self.jail.oom_score_adj,
        };
        match step::start(&jail, request.argv, request.env, request.stdio) {
            Started::Running(pid) => Ok(pid),
            Started::Failed(message) => Err(message),
        }
    }
}
