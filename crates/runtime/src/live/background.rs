//! Background commands: started with `Exec{background: true}`, so their stdin stays open. A handle sends stdin,
//! signals and kills; its events (output chunks, then the exit) arrive on a receiver.
//!
//! The agent answers `StdinData`/`StdinClose`/`Signal` with `Done`/`Failed` under the command's own id, the same id
//! its output and exit come under. A router task splits that stream: output and exit go to the events receiver, the
//! control replies to their waiters in request order (the agent answers one channel's requests in order, and control
//! requests are sent under a lock so the waiter queue has the same order).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use sandkasten_protocol::Message;
use sandkasten_types::{CommandExit, CommandSpec, Failure, FailureKind, PtySize, StreamKind};
use tokio::sync::{mpsc, oneshot};

use super::agent_client::{AgentClient, sandbox_gone, unexpected};
use super::phases::CommandClock;

/// How long a control request may wait for the agent's answer.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// What a background command reports.
#[derive(Debug, Clone, PartialEq)]
pub enum BackgroundEvent {
    /// Output, in order per stream.
    Output(StreamKind, Vec<u8>),
    /// The command ended; nothing follows.
    Exited(CommandExit),
}

type Waiters = Arc<Mutex<VecDeque<oneshot::Sender<Result<(), Failure>>>>>;

/// A running background command. Dropping the handle kills the command's process group.
pub struct BackgroundCommand {
    agent: Arc<AgentClient>,
    id: u64,
    pid: u32,
    waiters: Waiters,
    control: tokio::sync::Mutex<()>,
}

impl AgentClient {
    /// Starts `spec` as a background command; returns its handle and its events. Past `output_limit` bytes of a
    /// stream the agent stops reading it.
    pub async fn spawn_background(
        self: &Arc<Self>,
        spec: CommandSpec,
        output_limit: Option<u64>,
    ) -> Result<(BackgroundCommand, mpsc::UnboundedReceiver<BackgroundEvent>), Failure> {
        let mut clock = CommandClock::start();
        let (id, mut replies) = self.start(Message::Exec { spec, background: true, output_limit }).await?;
        let pid = match replies.recv().await {
            Some(Message::ExecStarted { pid }) => {
                clock.started();
                pid
            }
            Some(Message::Failed(failure)) => {
                self.finish(id);
                return Err(failure);
            }
            Some(other) => {
                self.finish(id);
                return Err(unexpected(&other));
            }
            None => return Err(sandbox_gone()),
        };
        let (events, received) = mpsc::unbounded_channel();
        let waiters: Waiters = Arc::default();
        tokio::spawn(route(replies, events, Arc::clone(&waiters), clock));
        let handle =
            BackgroundCommand { agent: Arc::clone(self), id, pid, waiters, control: tokio::sync::Mutex::new(()) };
        Ok((handle, received))
    }
}

/// Splits the command's replies into events and control answers until the route closes; the exit gets the command's
/// phases from `clock`.
async fn route(
    mut replies: mpsc::UnboundedReceiver<Message>,
    events: mpsc::UnboundedSender<BackgroundEvent>,
    waiters: Waiters,
    mut clock: CommandClock,
) {
    let answer = |result: Result<(), Failure>| {
        if let Some(waiter) = waiters.lock().ok().and_then(|mut queue| queue.pop_front()) {
            let _ = waiter.send(result);
        }
    };
    while let Some(message) = replies.recv().await {
        match message {
            Message::Output { stream, data } => {
                clock.output();
                if let Ok(bytes) = BASE64.decode(data) {
                    let _ = events.send(BackgroundEvent::Output(stream, bytes));
                }
            }
            Message::ExecExited { mut exit } => {
                exit.phases = clock.finish();
                let _ = events.send(BackgroundEvent::Exited(exit));
            }
            Message::Done => answer(Ok(())),
            Message::Failed(failure) => answer(Err(failure)),
            _ => {}
        }
    }
    // The agent is gone or the handle was dropped: nobody will answer the waiters (dropping them tells them).
    if let Ok(mut queue) = waiters.lock() {
        queue.clear();
    }
}

/// Tells the agent to stop reading a background command's stream (what the host would drop anyway).
pub struct OutputStopper {
    agent: Arc<AgentClient>,
    id: u64,
}

impl OutputStopper {
    /// The agent stops reading `stream` and closes it (no answer; a command that ended is ignored).
    pub async fn stop(&self, stream: StreamKind) {
        let _ = self.agent.send(self.id, Message::StopOutput { stream }).await;
    }
}

impl BackgroundCommand {
    /// The command's pid inside the sandbox (also its process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Something that stops the command's output streams without holding the command (whose drop kills it).
    pub fn output_stopper(&self) -> OutputStopper {
        OutputStopper { agent: Arc::clone(&self.agent), id: self.id }
    }

    async fn control(&self, msg: Message) -> Result<(), Failure> {
        let (answer, answered) = oneshot::channel();
        {
            let _order = self.control.lock().await;
            self.waiters.lock().map_err(|_| sandbox_gone())?.push_back(answer);
            self.agent.send(self.id, msg).await?;
        }
        match tokio::time::timeout(CONTROL_TIMEOUT, answered).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(sandbox_gone()),
            Err(_) => Err(Failure::new(FailureKind::Internal, "the agent did not answer in time")),
        }
    }

    /// Writes bytes to the command's stdin.
    pub async fn send_stdin(&self, data: &[u8]) -> Result<(), Failure> {
        self.control(Message::StdinData { data: BASE64.encode(data) }).await
    }

    /// Closes the command's stdin.
    pub async fn close_stdin(&self) -> Result<(), Failure> {
        self.control(Message::StdinClose).await
    }

    /// Sends a signal to the command's process group.
    pub async fn signal(&self, signal: i32) -> Result<(), Failure> {
        self.control(Message::Signal { signal }).await
    }

    /// Gives the command's pseudo-terminal a new size.
    pub async fn resize(&self, size: PtySize) -> Result<(), Failure> {
        self.control(Message::Resize { size }).await
    }

    /// SIGKILLs the command's process group.
    pub async fn kill(&self) -> Result<(), Failure> {
        self.signal(libc::SIGKILL).await
    }
}

impl Drop for BackgroundCommand {
    fn drop(&mut self) {
        // Stop routing (the router task ends), then kill whatever is left without waiting for the answer.
        self.agent.finish(self.id);
        let (agent, id) = (Arc::clone(&self.agent), self.id);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = agent.send(id, Message::Signal { signal: libc::SIGKILL }).await;
            });
        }
    }
}
