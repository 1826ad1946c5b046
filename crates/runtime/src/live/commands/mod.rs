//! Background commands of every sandbox, under ids the caller chooses: each runs with its stdin open (unless it was
//! given stdin, which is written and closed), a task pumps its output into a bounded `OutputLog` (charged to the
//! sandbox's output budget while it is kept), and any number of
//! listeners read that log from any offset — so a client can disconnect and reconnect and replay what is retained.
//! Per sandbox at most `MAX_RUNNING` run at once and the `MAX_ENDED` most recently ended are kept; forgetting a
//! sandbox drops its commands, which kills those still running.
//!
//! Files: `log` (the retained output), `listen` (one listener), `error`.

mod error;
mod listen;
mod log;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use sandkasten_types::{CommandEvent, CommandSpec, CommandStatus, Failure, FailureKind, PtySize};
use tokio::sync::mpsc;

pub use log::{Ending, OutputLog};

use super::agent_client::{AgentClient, sandbox_gone};
use super::background::{BackgroundCommand, BackgroundEvent, OutputStopper};
use super::limits::Counters;
use crate::retained::OutputRetention;
use sandkasten_cgroups::Cgroup;

/// Most background commands one sandbox runs at once.
pub const MAX_RUNNING: usize = 16;
/// Most ended background commands one sandbox keeps (the oldest are forgotten first).
pub const MAX_ENDED: usize = 16;

fn now_ms() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// What the pump and the listeners share (not the handle, so that dropping an entry kills the command).
struct Shared {
    id: String,
    argv: Vec<String>,
    pid: u32,
    started_ms: i64,
    log: OutputLog,
}

impl Shared {
    fn status(&self) -> CommandStatus {
        let ending = self.log.ending();
        let (stdout_truncated, stderr_truncated) = self.log.truncated();
        CommandStatus {
            id: self.id.clone(),
            argv: self.argv.clone(),
            pid: self.pid,
            started_ms: self.started_ms,
            ended_ms: ending.map(|e| e.ended_ms),
            exit: ending.and_then(|e| e.exit),
            stdout_truncated,
            stderr_truncated,
        }
    }

    fn running(&self) -> bool {
        self.log.ending().is_none()
    }
}

struct Entry {
    shared: Arc<Shared>,
    handle: BackgroundCommand,
    stdin_open: AtomicBool,
}

impl Entry {
    /// Agent failures of a control request: `NotFound` means the process is gone (it ended).
    fn control_error(&self, failure: Failure) -> Failure {
        match failure.kind {
            FailureKind::NotFound => error::ended(&self.shared.id),
            _ => failure,
        }
    }
}

/// Feeds a command's events into its log until it ends; the exit is completed from the sandbox's cgroup counters
/// (taken as `before` when it started: the OOM killer, refused forks, CPU time), as a foreground command's is.
/// Once the log keeps no more of a stream (its limit or the sandbox's output budget), the agent stops reading it.
async fn pump(
    mut events: mpsc::UnboundedReceiver<BackgroundEvent>,
    shared: Arc<Shared>,
    counters: Counters,
    stopper: OutputStopper,
) {
    while let Some(event) = events.recv().await {
        match event {
            BackgroundEvent::Output(stream, data) => {
                if shared.log.push(stream, &data) {
                    stopper.stop(stream).await;
                }
            }
            BackgroundEvent::Exited(mut exit) => {
                counters.annotate(&mut exit);
                shared.log.finish(Ending { exit: Some(exit), ended_ms: now_ms() });
                return;
            }
        }
    }
    // The sandbox (or the handle) went away before the exit was reported.
    shared.log.finish(Ending { exit: None, ended_ms: now_ms() });
}

/// The background commands of every sandbox of one runtime.
#[derive(Default)]
pub struct BackgroundCommands {
    sandboxes: Mutex<HashMap<String, Vec<Arc<Entry>>>>,
}

impl BackgroundCommands {
    fn with<T>(&self, sandbox: &str, f: impl FnOnce(&mut Vec<Arc<Entry>>) -> T) -> Result<T, Failure> {
        let mut map = self.sandboxes.lock().map_err(|_| sandbox_gone())?;
        Ok(f(map.entry(sandbox.to_owned()).or_default()))
    }

    fn find(&self, sandbox: &str, id: &str) -> Result<Arc<Entry>, Failure> {
        let map = self.sandboxes.lock().map_err(|_| sandbox_gone())?;
        let entries = map.get(sandbox).map(Vec::as_slice).unwrap_or_default();
        entries.iter().find(|e| e.shared.id == id).cloned().ok_or_else(|| error::not_found(id))
    }

    /// Starts `spec` in the background under `id`, keeping of its output what `retention` allows; `cgroup` (the
    /// sandbox's) says at its end which limit fired and what it used.
    pub async fn start(
        &self,
        agent: &Arc<AgentClient>,
        cgroup: Option<Arc<Cgroup>>,
        sandbox: &str,
        id: &str,
        spec: CommandSpec,
        retention: OutputRetention,
    ) -> Result<CommandStatus, Failure> {
        self.with(sandbox, |entries| {
            if entries.iter().any(|e| e.shared.id == id) {
                return Err(error::duplicate(id));
            }
            if entries.iter().filter(|e| e.shared.running()).count() >= MAX_RUNNING {
                return Err(error::too_many(MAX_RUNNING));
            }
            Ok(())
        })??;
        let argv = spec.resolved_argv().map_err(|message| Failure::new(FailureKind::ExecFailed, message))?;
        // A terminal's input is never closed (`spec.stdin` is typed into it and it stays open).
        let given_stdin = spec.stdin.is_some() && spec.pty.is_none();
        let counters = Counters::before(cgroup);
        // One stream can never keep more than the whole budget: the agent need not read more of it.
        let agent_limit = retention.per_stream.min(retention.budget.limit());
        let (handle, events) = agent.spawn_background(spec, Some(agent_limit)).await?;
        if given_stdin {
            // The bytes are queued in the agent; closing takes effect once they are written. A command that has
            // already ended (and been reaped) has no stdin left to close: that is not a failure to start.
            match handle.close_stdin().await {
                Err(failure) if failure.kind == FailureKind::NotFound => {}
                closed => closed?,
            }
        }
        let shared = Arc::new(Shared {
            id: id.to_owned(),
            argv,
            pid: handle.pid(),
            started_ms: now_ms(),
            log: OutputLog::new(retention),
        });
        tokio::spawn(pump(events, Arc::clone(&shared), counters, handle.output_stopper()));
        let entry = Arc::new(Entry { shared: Arc::clone(&shared), handle, stdin_open: AtomicBool::new(!given_stdin) });
        self.with(sandbox, |entries| {
            entries.push(entry);
            let ended = entries.iter().filter(|e| !e.shared.running()).count();
            let mut excess = ended.saturating_sub(MAX_ENDED);
            entries.retain(|e| {
                let evict = excess > 0 && !e.shared.running();
                excess -= usize::from(evict);
                !evict
            });
        })?;
        Ok(shared.status())
    }

    /// The sandbox's running and recently ended commands, oldest first.
    pub fn list(&self, sandbox: &str) -> Vec<CommandStatus> {
        let map = self.sandboxes.lock();
        let entries = map.as_ref().ok().and_then(|map| map.get(sandbox));
        entries.map(|entries| entries.iter().map(|e| e.shared.status()).collect()).unwrap_or_default()
    }

    /// The command's retained output from byte `offset` on, then its live output, then its end.
    pub fn stream(&self, sandbox: &str, id: &str, offset: u64) -> Result<mpsc::Receiver<CommandEvent>, Failure> {
        let shared = Arc::clone(&self.find(sandbox, id)?.shared);
        let (events, received) = mpsc::channel(16);
        tokio::spawn(listen::listen(shared, offset, events));
        Ok(received)
    }

    /// Writes `data` to the command's stdin, then closes it when `eof` is set.
    pub async fn stdin(&self, sandbox: &str, id: &str, data: &[u8], eof: bool) -> Result<(), Failure> {
        let entry = self.find(sandbox, id)?;
        if !entry.shared.running() {
            return Err(error::ended(id));
        }
        if !entry.stdin_open.load(Ordering::Acquire) {
            return Err(error::stdin_closed(id));
        }
        if !data.is_empty() {
            entry.handle.send_stdin(data).await.map_err(|f| entry.control_error(f))?;
        }
        if eof {
            entry.stdin_open.store(false, Ordering::Release);
            entry.handle.close_stdin().await.map_err(|f| entry.control_error(f))?;
        }
        Ok(())
    }

    /// Sends `signal` to the command's process group.
    pub async fn signal(&self, sandbox: &str, id: &str, signal: i32) -> Result<(), Failure> {
        let entry = self.find(sandbox, id)?;
        if !entry.shared.running() {
            return Err(error::ended(id));
        }
        entry.handle.signal(signal).await.map_err(|f| entry.control_error(f))
    }

    /// Gives the command's pseudo-terminal a new size.
    pub async fn resize(&self, sandbox: &str, id: &str, size: PtySize) -> Result<(), Failure> {
        let entry = self.find(sandbox, id)?;
        if !entry.shared.running() {
            return Err(error::ended(id));
        }
        entry.handle.resize(size).await.map_err(|f| entry.control_error(f))
    }

    /// SIGKILLs the command's process group; a command that has ended already is left as it is.
    pub async fn kill(&self, sandbox: &str, id: &str) -> Result<(), Failure> {
        let entry = self.find(sandbox, id)?;
        if !entry.shared.running() {
            return Ok(());
        }
        match entry.handle.signal(libc::SIGKILL).await {
            // The process is gone: it ended meanwhile.
            Err(failure) if failure.kind == FailureKind::NotFound => Ok(()),
            other => other,
        }
    }

    /// Forgets every command of a sandbox; those still running are killed.
    pub fn forget(&self, sandbox: &str) {
        let removed = self.sandboxes.lock().ok().and_then(|mut map| map.remove(sandbox));
        drop(removed);
    }

    /// Forgets every command of every sandbox.
    pub fn forget_all(&self) {
        let removed = self.sandboxes.lock().ok().map(|mut map| std::mem::take(&mut *map));
        drop(removed);
    }
}
