//! Background commands of the fake runtime: each runs in a task, its output is retained per command (up to the
//! output limit per stream) and streamed from any byte offset like the real runtime's. Programs: `steps …` (as in
//! `fake.rs`: `out:`, `err:`, `sleep:`, `exit:`), `cat` (echoes stdin until end-of-file), `sleep-ms N`, `timeout`
//! (killed at its timeout); anything else exits 127. Any signal ends a running command with that signal.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandkasten_types::{
    CommandEvent, CommandExit, CommandSpec, CommandStatus, Failure, FailureKind, OutputChunk, PtySize, StreamKind,
};
use tokio::sync::{mpsc, watch};

enum Control {
    Stdin(Vec<u8>),
    Eof,
    Signal(i32),
}

#[derive(Default)]
struct Log {
    pieces: Vec<(StreamKind, Vec<u8>, u64)>,
    total: u64,
    accepted: [u64; 2],
    truncated: [bool; 2],
}

struct Command {
    limit: u64,
    status: Mutex<CommandStatus>,
    log: Mutex<Log>,
    changed: watch::Sender<u64>,
    control: mpsc::UnboundedSender<Control>,
    stdin_open: AtomicBool,
    /// Started with `spec.pty`: its size, changed by resizes.
    pty: Mutex<Option<PtySize>>,
}

impl Command {
    fn push(&self, stream: StreamKind, data: &[u8]) {
        let mut log = self.log.lock().unwrap();
        let index = usize::from(stream == StreamKind::Stderr);
        let take = data.len().min((self.limit - log.accepted[index]) as usize);
        log.truncated[index] |= take < data.len();
        log.accepted[index] += take as u64;
        if take > 0 {
            log.total += take as u64;
            let end = log.total;
            log.pieces.push((stream, data[..take].to_vec(), end));
        }
        drop(log);
        self.changed.send_modify(|v| *v += 1);
    }

    fn finish(&self, exit: Option<CommandExit>) {
        let truncated = self.log.lock().unwrap().truncated;
        let mut status = self.status.lock().unwrap();
        if status.ended_ms.is_none() {
            status.ended_ms = Some(status.started_ms + 1);
            status.exit = exit;
            (status.stdout_truncated, status.stderr_truncated) = (truncated[0], truncated[1]);
        }
        drop(status);
        self.changed.send_modify(|v| *v += 1);
    }

    fn running(&self) -> bool {
        self.status.lock().unwrap().ended_ms.is_none()
    }
}

fn code(n: i32) -> Option<CommandExit> {
    Some(CommandExit { exit_code: Some(n), signal: None, timed_out: false, ..CommandExit::default() })
}

fn killed(signal: i32) -> Option<CommandExit> {
    Some(CommandExit { exit_code: None, signal: Some(signal), timed_out: false, ..CommandExit::default() })
}

/// Sleeps `ms` unless a signal comes first (then returns it).
async fn sleep_or_signal(ms: u64, control: &mut mpsc::UnboundedReceiver<Control>) -> Option<i32> {
    let sleep = tokio::time::sleep(Duration::from_millis(ms));
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            () = &mut sleep => return None,
            message = control.recv() => match message {
                Some(Control::Signal(signal)) => return Some(signal),
                Some(_) => {}
                None => return Some(9),
            },
        }
    }
}

async fn run(command: Arc<Command>, argv: Vec<String>, mut control: mpsc::UnboundedReceiver<Control>) {
    let exit = match argv[0].as_str() {
        "steps" => {
            let mut exit = code(0);
            for step in &argv[1..] {
                let (op, arg) = step.split_once(':').unwrap_or((step, ""));
                match op {
                    "out" => command.push(StreamKind::Stdout, arg.as_bytes()),
                    "err" => command.push(StreamKind::Stderr, arg.as_bytes()),
                    "exit" => exit = code(arg.parse().unwrap_or(1)),
                    "sleep" => {
                        if let Some(signal) = sleep_or_signal(arg.parse().unwrap_or(0), &mut control).await {
                            exit = killed(signal);
                            break;
                        }
                    }
                    _ => {}
                }
            }
            exit
        }
        "sleep-ms" => {
            match sleep_or_signal(argv.get(1).and_then(|a| a.parse().ok()).unwrap_or(0), &mut control).await {
                Some(signal) => killed(signal),
                None => code(0),
            }
        }
        "timeout" => Some(CommandExit { exit_code: None, signal: Some(9), timed_out: true, ..CommandExit::default() }),
        "cat" => loop {
            match control.recv().await {
                Some(Control::Stdin(data)) => command.push(StreamKind::Stdout, &data),
                Some(Control::Eof) => break code(0),
                Some(Control::Signal(signal)) => break killed(signal),
                None => break None,
            }
        },
        other => {
            command.push(StreamKind::Stderr, format!("{other}: command not found\n").as_bytes());
            code(127)
        }
    };
    command.finish(exit);
}

async fn listen(command: Arc<Command>, mut offset: u64, events: mpsc::Sender<CommandEvent>) {
    let mut changed = command.changed.subscribe();
    loop {
        changed.borrow_and_update();
        let ended = !command.running();
        let pieces: Vec<_> = command.log.lock().unwrap().pieces.iter().filter(|p| p.2 > offset).cloned().collect();
        for (stream, data, end) in pieces {
            let skip = offset.saturating_sub(end - data.len() as u64) as usize;
            let chunk = OutputChunk { stream, data: data[skip.min(data.len())..].to_vec() };
            if events.send(CommandEvent::Output { chunk, offset: end }).await.is_err() {
                return;
            }
            offset = end;
        }
        if ended {
            let status = command.status.lock().unwrap().clone();
            let _ = events.send(CommandEvent::Ended(status)).await;
            return;
        }
        tokio::select! {
            result = changed.changed() => if result.is_err() { return },
            () = events.closed() => return,
        }
    }
}

fn failure(kind: FailureKind, message: impl Into<String>) -> Failure {
    Failure::new(kind, message)
}

/// The background commands of every fake sandbox.
#[derive(Default)]
pub(crate) struct FakeCommands {
    sandboxes: Mutex<HashMap<String, Vec<Arc<Command>>>>,
}

impl FakeCommands {
    fn find(&self, id: &str, command_id: &str) -> Result<Arc<Command>, Failure> {
        let map = self.sandboxes.lock().unwrap();
        let found = map.get(id).into_iter().flatten().find(|c| c.status.lock().unwrap().id == command_id).cloned();
        found.ok_or_else(|| failure(FailureKind::NotFound, format!("no command {command_id} in this sandbox")))
    }

    pub(crate) fn start(
        &self,
        id: &str,
        command_id: &str,
        spec: CommandSpec,
        limit: u64,
    ) -> Result<CommandStatus, Failure> {
        let argv = spec.resolved_argv().map_err(|e| failure(FailureKind::ExecFailed, e))?;
        let (control, received) = mpsc::unbounded_channel();
        let status = CommandStatus {
            id: command_id.into(),
            argv: argv.clone(),
            pid: 100,
            started_ms: 1_700_000_000_000,
            ended_ms: None,
            exit: None,
            stdout_truncated: false,
            stderr_truncated: false,
        };
        let given_stdin = spec.stdin.clone();
        let command = Arc::new(Command {
            limit,
            status: Mutex::new(status.clone()),
            log: Mutex::default(),
            changed: watch::channel(0).0,
            control,
            stdin_open: AtomicBool::new(given_stdin.is_none()),
            pty: Mutex::new(spec.pty),
        });
        if let Some(text) = given_stdin {
            command.control.send(Control::Stdin(text.into_bytes())).ok();
            command.control.send(Control::Eof).ok();
        }
        tokio::spawn(run(Arc::clone(&command), argv, received));
        self.sandboxes.lock().unwrap().entry(id.into()).or_default().push(command);
        Ok(status)
    }

    pub(crate) fn list(&self, id: &str) -> Vec<CommandStatus> {
        let map = self.sandboxes.lock().unwrap();
        map.get(id).into_iter().flatten().map(|c| c.status.lock().unwrap().clone()).collect()
    }

    pub(crate) fn stream(
        &self,
        id: &str,
        command_id: &str,
        offset: u64,
    ) -> Result<mpsc::Receiver<CommandEvent>, Failure> {
        let command = self.find(id, command_id)?;
        let (events, received) = mpsc::channel(16);
        tokio::spawn(listen(command, offset, events));
        Ok(received)
    }

    pub(crate) fn stdin(&self, id: &str, command_id: &str, data: Vec<u8>, eof: bool) -> Result<(), Failure> {
        let command = self.find(id, command_id)?;
        if !command.running() {
            return Err(failure(FailureKind::Conflict, format!("command {command_id} has ended")));
        }
        if !command.stdin_open.load(Ordering::SeqCst) {
            return Err(failure(FailureKind::Conflict, format!("the stdin of command {command_id} is closed")));
        }
        command.control.send(Control::Stdin(data)).ok();
        if eof {
            command.stdin_open.store(false, Ordering::SeqCst);
            command.control.send(Control::Eof).ok();
        }
        Ok(())
    }

    pub(crate) fn signal(&self, id: &str, command_id: &str, signal: i32) -> Result<(), Failure> {
        let command = self.find(id, command_id)?;
        if !command.running() {
            return if signal == 9 {
                Ok(())
            } else {
                Err(failure(FailureKind::Conflict, format!("command {command_id} has ended")))
            };
        }
        command.control.send(Control::Signal(signal)).ok();
        Ok(())
    }

    pub(crate) fn resize(&self, id: &str, command_id: &str, size: PtySize) -> Result<(), Failure> {
        let command = self.find(id, command_id)?;
        if !command.running() {
            return Err(failure(FailureKind::Conflict, format!("command {command_id} has ended")));
        }
        match &mut *command.pty.lock().unwrap() {
            Some(current) => *current = size,
            None => return Err(failure(FailureKind::Conflict, format!("command {command_id} has no pseudo-terminal"))),
        }
        Ok(())
    }

    /// Forgets a sandbox's commands; running ones end as lost (no exit status).
    pub(crate) fn forget(&self, id: &str) {
        for command in self.sandboxes.lock().unwrap().remove(id).into_iter().flatten() {
            command.finish(None);
            command.control.send(Control::Signal(9)).ok();
        }
    }
}
