//! Serve mode: the agent of a long-lived sandbox. After the same setup as a one-shot run, instead of running one
//! program the agent answers the host's requests until `Shutdown` or until the host goes away: it runs commands
//! (foreground or background, with streaming output, stdin, signals and timeouts) and file operations (resolved
//! inside the sandbox root, with the sandbox user's permissions), and it reaps every process as PID 1.
//!
//! Files: `event_loop` (poll + dispatch), `channel` (non-blocking frames, outgoing queue, backpressure),
//! `commands` (start, stdin, signals, timeouts), `output` (pipes ↔ frames, when a command is finished), `signals`
//! (SIGCHLD + reaping), `launcher` (how a command is started), `files` + `remove` (file requests), `paths`
//! (resolution in the root, filesystem identity), `terminal` (pseudo-terminals of `pty` commands), `watch`
//! (directory watches: inotify), `ports` (connections to ports inside the sandbox for the host), `sudo` (the
//! sandbox's `sudo`, served from inside), `errors`.

mod channel;
mod commands;
mod disk;
mod errors;
mod event_loop;
mod files;
pub(crate) mod guest_oom;
mod launcher;
mod metadata;
pub(crate) mod output;
mod paths;
mod ports;
mod remove;
mod resolve;
mod signals;
mod sudo;
mod terminal;
mod watch;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::os::unix::net::UnixStream;

pub use commands::{DEFAULT_CWD, DRAIN_NS, MAX_COMMANDS, MAX_STDIN_BUFFER};
pub use errors::ServeError;
pub use event_loop::LoopEnd;
pub use launcher::{JailLauncher, LaunchRequest, Launcher};
pub use paths::{FsIdentity, SandboxRoot};

/// What serve mode runs with.
pub struct ServeContext<'a> {
    /// The sandbox root (`/` after pivot_root) and the identity file operations take.
    pub root: SandboxRoot,
    /// The sandbox's base environment (`PATH`, `HOME`, `LANG`, the user's); each command adds its own on top.
    pub base_env: &'a BTreeMap<String, String>,
    /// How commands are started.
    pub launcher: &'a dyn Launcher,
    /// The sandbox user's home (whose filesystem the disk limit measures).
    pub home: &'a str,
    /// The working directory of commands that name none: a built template's `workdir`, else the home.
    pub workdir: &'a str,
    /// The disk limit: a writable filesystem holding this much is full (`output::is_full`); 0 when none is set.
    pub disk_bytes: u64,
    /// Connections to host sockets the agent holds besides its channel (gVisor's egress door), if any.
    pub host_connections: Option<&'a dyn HostConnections>,
}

/// What holds connections to host sockets besides the channel (gVisor's egress door). runsc cannot checkpoint a
/// sandbox with such a connection open, so `Quiesce` closes them all and keeps new ones from opening, and `Resumed`
/// lets them open again.
pub trait HostConnections {
    /// Closes every connection and opens none until `reopen`; returns once they are closed.
    fn close_all(&self);
    /// Serves connections again.
    fn reopen(&self);
    /// The serve loop reaped these children (one may be the holder's own process).
    fn reaped(&self, pids: &[libc::pid_t]);
}

/// Serves the host's requests on `channel` until `Shutdown` (answered with `Done`) or until the host closes it.
/// Every command's process group is killed before returning.
pub fn serve(channel: UnixStream, context: &ServeContext<'_>) -> Result<LoopEnd, ServeError> {
    occupy_standard_descriptors();
    let signals = signals::ChildSignals::new()?;
    let mut channel = channel::Channel::new(channel)?;
    let commands = commands::CommandContext {
        root: &context.root,
        base_env: context.base_env,
        launcher: context.launcher,
        home: context.home,
        workdir: context.workdir,
        disk_bytes: context.disk_bytes,
        host_connections: context.host_connections,
    };
    event_loop::run(&mut channel, &signals, &commands)
}

/// Makes sure descriptors 0, 1 and 2 are open (on `/dev/null` if they were closed), so that no pipe created for a
/// command lands on them: the launcher's `dup2` onto 0..2 would then be a no-op that leaves close-on-exec set.
fn occupy_standard_descriptors() {
    use std::os::fd::{AsRawFd, IntoRawFd};
    for _ in 0..3 {
        match std::fs::File::open("/dev/null") {
            Ok(file) if file.as_raw_fd() <= 2 => {
                // Kept open for the life of the agent as one of its standard descriptors.
                let _ = file.into_raw_fd();
            }
            Ok(_) | Err(_) => return,
        }
    }
}
