//! The commands of a long-lived sandbox: starting them (pipes, environment, working directory, launcher), their
//! stdin queue, signals to their process group, timeouts, exit statuses, and deciding when a command is finished.
//! Output pumping lives in `output.rs`.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::pipe::PipeFlags;
use rustix::process::{Pid, Signal};
use sandkasten_jail::process::Stdio;
use sandkasten_protocol::RunningCommand;
use sandkasten_types::{CommandExit, CommandSpec, CommandUser, Failure, FailureKind, LimitKind, PtySize};

use super::errors::sys_failure;
use super::launcher::{LaunchRequest, Launcher};
use super::paths::SandboxRoot;
use super::terminal;
use crate::reaper::ExitStatus;

/// Working directory of a command that names none, in a sandbox of the host template.
pub const DEFAULT_CWD: &str = "/workspace";
/// Most commands running at once.
pub const MAX_COMMANDS: usize = 256;
/// Most stdin bytes buffered for one command (the host must wait for `Done` before sending more).
pub const MAX_STDIN_BUFFER: usize = 8 << 20;
/// What a terminal in canonical mode reads as end of file (`^D`).
const END_OF_TRANSMISSION: u8 = 0x04;
/// How long output pipes may stay open after the command's process exited (a daemon it left behind holds them).
pub const DRAIN_NS: u64 = 50_000_000;

/// What the loop needs to start commands.
pub struct CommandContext<'a> {
    /// The sandbox root (working directories are resolved in it).
    pub root: &'a SandboxRoot,
    /// The sandbox's base environment; a command's own variables are added on top.
    pub base_env: &'a BTreeMap<String, String>,
    /// How commands are started.
    pub launcher: &'a dyn Launcher,
    /// The sandbox user's home.
    pub home: &'a str,
    /// The working directory of commands that name none.
    pub workdir: &'a str,
    /// The disk limit (`ServeContext::disk_bytes`).
    pub disk_bytes: u64,
    /// Connections to host sockets besides the channel, closed before a checkpoint (`Quiesce`).
    pub host_connections: Option<&'a dyn super::HostConnections>,
}

/// A command's stdin: bytes not yet written, and whether to close it once they are.
pub struct StdinPipe {
    pub(super) fd: OwnedFd,
    pub(super) pending: Vec<u8>,
    pub(super) close_when_drained: bool,
}

/// One started command.
pub struct Command {
    pub(super) pid: libc::pid_t,
    pub(super) argv: Vec<String>,
    pub(super) stdout: Option<OwnedFd>,
    pub(super) stderr: Option<OwnedFd>,
    /// Bytes sent of (stdout, stderr), and how many of each the host keeps (past that, the stream is discarded).
    pub(super) sent: [u64; 2],
    pub(super) output_limit: Option<u64>,
    /// Whether (stdout, stderr) is read into nothing (past the limit, or after `StopOutput`).
    pub(super) discarding: [bool; 2],
    pub(super) stdin: Option<StdinPipe>,
    pub(super) deadline_ns: Option<u64>,
    pub(super) exit: Option<ExitStatus>,
    pub(super) exited_at_ns: u64,
    pub(super) killed_by_timeout: bool,
    /// The guest kernel's OOM kills when it started (a microVM's agent only: `guest_oom`).
    pub(super) oom_kills_at_start: Option<u64>,
    /// It runs on a pseudo-terminal: `stdout` reads its master, `stdin` writes it, there is no `stderr`.
    pub(super) terminal: bool,
}

impl Command {
    /// True when the process exited and the drain window passed.
    pub fn drain_expired(&self, now_ns: u64) -> bool {
        self.exit.is_some() && now_ns >= self.exited_at_ns.saturating_add(DRAIN_NS)
    }

    /// The report: how it ended, and which limit the agent saw fire (its timeout; the disk, when a writable
    /// filesystem is full or the program died of `RLIMIT_FSIZE`). The host adds what only the cgroup knows.
    pub fn command_exit(&self, disk_full: bool) -> CommandExit {
        let status = self.exit.unwrap_or(ExitStatus { exit_code: None, signal: Some(libc::SIGKILL) });
        let timed_out = self.killed_by_timeout && status.signal.is_some();
        let oom_killed =
            self.oom_kills_at_start.zip(super::guest_oom::count()).is_some_and(|(at_start, now)| now > at_start);
        let limit = if timed_out {
            Some(LimitKind::Time)
        } else if oom_killed {
            Some(LimitKind::Memory)
        } else if disk_full || status.signal == Some(libc::SIGXFSZ) {
            Some(LimitKind::Disk)
        } else {
            None
        };
        CommandExit {
            exit_code: status.exit_code,
            signal: status.signal,
            timed_out,
            oom_killed,
            limit,
            ..CommandExit::default()
        }
    }

    fn kill_group(&self, signal: Signal) -> Result<(), Errno> {
        match Pid::from_raw(self.pid) {
            Some(pid) => rustix::process::kill_process_group(pid, signal),
            None => Err(Errno::SRCH),
        }
    }
}

/// Every command not yet reported as exited, by id.
#[derive(Default)]
pub struct Commands {
    pub(super) table: BTreeMap<u64, Command>,
    /// Between `Quiesce` and `Resumed`: commands run on, but their output and exits are not reported (they wait in
    /// the pipes and the table), so that the agent's outgoing queue stays empty for a checkpoint.
    pub(super) quiet: bool,
}

/// The descriptors the child takes as its standard streams (pipe ends, or a pseudo-terminal's terminal as all
/// three), held until it has started.
struct ChildEnds {
    stdio: Stdio,
    _held: Vec<OwnedFd>,
}

fn nonblocking(fd: &OwnedFd) -> Result<(), Failure> {
    let flags = rustix::fs::fcntl_getfl(fd).map_err(|e| sys_failure("fcntl", "pipe", e))?;
    rustix::fs::fcntl_setfl(fd, flags | OFlags::NONBLOCK).map_err(|e| sys_failure("fcntl", "pipe", e))
}

fn pipe() -> Result<(OwnedFd, OwnedFd), Failure> {
    rustix::pipe::pipe_with(PipeFlags::CLOEXEC)
        .map_err(|e| Failure::new(FailureKind::Conflict, format!("creating a pipe failed: {e}")))
}

fn exec_failed(message: impl Into<String>) -> Failure {
    Failure::new(FailureKind::ExecFailed, message)
}

impl Commands {
    /// Starts a command with id `id`; returns its pid.
    pub fn start(
        &mut self,
        context: &CommandContext<'_>,
        id: u64,
        spec: &CommandSpec,
        background: bool,
        output_limit: Option<u64>,
        now_ns: u64,
    ) -> Result<libc::pid_t, Failure> {
        if self.table.contains_key(&id) {
            return Err(Failure::new(FailureKind::AlreadyExists, format!("command {id} is already running")));
        }
        if self.table.len() >= MAX_COMMANDS {
            return Err(Failure::new(FailureKind::Conflict, format!("{MAX_COMMANDS} commands are running already")));
        }
        let argv = spec.resolved_argv().map_err(exec_failed)?;
        let mut env = context.base_env.clone();
        env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        let cwd_path = spec.cwd.as_deref().unwrap_or(context.workdir);
        let cwd = context
            .root
            .as_sandbox_user(|| context.root.open_in_root(cwd_path, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()))
            .map_err(|e| match e.kind {
                FailureKind::NotFound => exec_failed(format!("working directory {cwd_path} does not exist")),
                FailureKind::NotADirectory => exec_failed(format!("working directory {cwd_path} is not a directory")),
                _ => exec_failed(format!("working directory {cwd_path}: {}", e.message)),
            })?;

        let as_root = spec.user == CommandUser::Root;
        let (child_ends, stdin_write, stdout_read, stderr_read, terminal) = match spec.pty {
            Some(size) => {
                let owner = if as_root { Some((0, 0)) } else { context.root.identity().map(|i| (i.uid, i.gid)) };
                let pair = terminal::open(size, owner)?;
                // Input and output are the master: one descriptor is written (stdin), a duplicate read (stdout).
                let reader = rustix::io::fcntl_dupfd_cloexec(&pair.master, 3)
                    .map_err(|e| sys_failure("duplicating", "the pseudo-terminal", e))?;
                let stdio = Stdio {
                    stdin: pair.terminal.as_raw_fd(),
                    stdout: pair.terminal.as_raw_fd(),
                    stderr: pair.terminal.as_raw_fd(),
                    controlling_terminal: true,
                };
                (ChildEnds { stdio, _held: vec![pair.terminal] }, pair.master, reader, None, true)
            }
            None => {
                let (stdin_read, stdin_write) = pipe()?;
                let (stdout_read, stdout_write) = pipe()?;
                let (stderr_read, stderr_write) = pipe()?;
                let stdio = Stdio {
                    stdin: stdin_read.as_raw_fd(),
                    stdout: stdout_write.as_raw_fd(),
                    stderr: stderr_write.as_raw_fd(),
                    controlling_terminal: false,
                };
                let held = vec![stdin_read, stdout_write, stderr_write];
                (ChildEnds { stdio, _held: held }, stdin_write, stdout_read, Some(stderr_read), false)
            }
        };
        for fd in [Some(&stdin_write), Some(&stdout_read), stderr_read.as_ref()].into_iter().flatten() {
            nonblocking(fd)?;
        }
        let request =
            LaunchRequest { argv: &argv, env: &env, cwd_path, cwd: cwd.as_fd(), stdio: child_ends.stdio, as_root };
        let pid = context.launcher.launch(&request).map_err(exec_failed)?;
        // The child has its ends; the agent keeps none (a terminal the agent held open would never hang up).
        drop(child_ends);

        let pending = spec.stdin.clone().map(String::into_bytes).unwrap_or_default();
        // A terminal's input stays open while the command runs (`spec.stdin` is typed into it first).
        let stdin = (background || terminal || !pending.is_empty()).then_some(StdinPipe {
            fd: stdin_write,
            pending,
            close_when_drained: !background && !terminal,
        });
        self.table.insert(
            id,
            Command {
                pid,
                argv,
                stdout: Some(stdout_read),
                stderr: stderr_read,
                sent: [0; 2],
                output_limit,
                discarding: [false; 2],
                stdin,
                deadline_ns: spec.timeout_ms.map(|ms| now_ns.saturating_add(ms.saturating_mul(1_000_000))),
                exit: None,
                exited_at_ns: 0,
                killed_by_timeout: false,
                oom_kills_at_start: super::guest_oom::count(),
                terminal,
            },
        );
        Ok(pid)
    }

    fn get_mut(&mut self, id: u64) -> Result<&mut Command, Failure> {
        let missing = || Failure::new(FailureKind::NotFound, format!("no command {id} is running"));
        self.table.get_mut(&id).ok_or_else(missing)
    }

    fn open_stdin(&mut self, id: u64) -> Result<&mut StdinPipe, Failure> {
        let command = self.get_mut(id)?;
        match &mut command.stdin {
            Some(stdin) if !stdin.close_when_drained => Ok(stdin),
            _ => Err(Failure::new(FailureKind::NotFound, format!("command {id}'s stdin is closed"))),
        }
    }

    /// Queues bytes for a command's stdin.
    pub fn stdin_data(&mut self, id: u64, bytes: &[u8]) -> Result<(), Failure> {
        let stdin = self.open_stdin(id)?;
        if stdin.pending.len().saturating_add(bytes.len()) > MAX_STDIN_BUFFER {
            return Err(Failure::new(
                FailureKind::StdinFull,
                format!("command {id}'s stdin buffer is full (it has not read what was sent before): send it later"),
            ));
        }
        stdin.pending.extend_from_slice(bytes);
        Ok(())
    }

    /// Closes a command's stdin once its buffered bytes are written. A terminal's input cannot be closed without
    /// hanging it up: it gets the end-of-file character (`^D`, which ends a line-reading program's input) instead.
    pub fn stdin_close(&mut self, id: u64) -> Result<(), Failure> {
        let command = self.get_mut(id)?;
        if command.terminal {
            if let Some(stdin) = &mut command.stdin {
                stdin.pending.push(END_OF_TRANSMISSION);
            }
            return Ok(());
        }
        match &mut command.stdin {
            Some(stdin) if stdin.pending.is_empty() => command.stdin = None,
            Some(stdin) => stdin.close_when_drained = true,
            None => {}
        }
        Ok(())
    }

    /// Sends `signal` to a command's process group.
    pub fn signal(&mut self, id: u64, signal: i32) -> Result<(), Failure> {
        let command = self.get_mut(id)?;
        // Named (standard) signals only: the real-time range is glibc's and the sandboxed program's business.
        let signal = Signal::from_named_raw(signal)
            .ok_or_else(|| Failure::new(FailureKind::Internal, format!("{signal} is not a standard signal number")))?;
        command.kill_group(signal).map_err(|e| match e {
            Errno::SRCH => Failure::new(FailureKind::NotFound, format!("command {id} has no process left")),
            other => sys_failure("signal", &format!("command {id}"), other),
        })
    }

    /// Gives a command's pseudo-terminal a new size.
    pub fn resize(&mut self, id: u64, size: PtySize) -> Result<(), Failure> {
        let command = self.get_mut(id)?;
        match (&command.stdout, command.terminal) {
            (Some(master), true) => {
                terminal::resize(master, size)?;
                terminal::signal_resized(master, command.pid);
                Ok(())
            }
            (None, true) => Err(Failure::new(FailureKind::NotFound, format!("command {id}'s terminal is closed"))),
            (_, false) => Err(Failure::new(
                FailureKind::Conflict,
                format!("command {id} has no pseudo-terminal to resize (start it with pty)"),
            )),
        }
    }

    /// The commands not yet reported, sorted by id.
    pub fn list(&self) -> Vec<RunningCommand> {
        let to_wire = |(&id, command): (&u64, &Command)| RunningCommand {
            id,
            pid: command.pid as u32,
            argv: command.argv.clone(),
        };
        self.table.iter().map(to_wire).collect()
    }

    /// Records the statuses of reaped processes (orphans are simply forgotten).
    pub fn record_exits(&mut self, reaped: &[(libc::pid_t, ExitStatus)], now_ns: u64) {
        for (pid, status) in reaped {
            if let Some(command) = self.table.values_mut().find(|c| c.pid == *pid && c.exit.is_none()) {
                command.exit = Some(*status);
                command.exited_at_ns = now_ns;
                // Nobody reads its stdin any more.
                command.stdin = None;
            }
        }
    }

    /// Moves every running command's deadline on by `ns` (the sandbox was paused that long).
    pub fn postpone_deadlines(&mut self, ns: u64) {
        for command in self.table.values_mut() {
            if let Some(deadline) = &mut command.deadline_ns {
                *deadline = deadline.saturating_add(ns);
            }
        }
    }

    /// Kills the process group of every command whose timeout has passed.
    pub fn enforce_timeouts(&mut self, now_ns: u64) {
        for command in self.table.values_mut() {
            let due = command.deadline_ns.is_some_and(|deadline| now_ns >= deadline);
            if due && command.exit.is_none() && !command.killed_by_timeout {
                command.killed_by_timeout = true;
                let _ = command.kill_group(Signal::KILL);
            }
        }
    }

    /// The next time something is due (a timeout; a drain window's end unless output is paused).
    pub fn next_due_ns(&self, output_paused: bool) -> Option<u64> {
        let due = |command: &Command| match command.exit {
            None if !command.killed_by_timeout => command.deadline_ns,
            Some(_) if !output_paused => Some(command.exited_at_ns.saturating_add(DRAIN_NS)),
            _ => None,
        };
        self.table.values().filter_map(due).min()
    }

    /// SIGKILLs every command's process group (shutdown, or the host is gone).
    pub fn kill_all(&mut self) {
        for command in self.table.values() {
            let _ = command.kill_group(Signal::KILL);
        }
    }
}
