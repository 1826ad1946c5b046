//! `AgentClient`: the host end of one long-lived agent's channel. Requests carry ids; a reader task routes every
//! reply to the request that is waiting for it, so any number of commands and file operations run at once. The
//! socket under it may be replaced while routes stay (a gVisor pause: `link`).

mod link;
mod ports;

pub use ports::PortStream;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use sandkasten_protocol::{Envelope, FrameDecoder, Message, encode};
use sandkasten_types::{
    CommandExit, CommandSpec, CommandUser, Failure, FailureKind, FileInfo, FileMetadata, FsEvent, OutputChunk,
};
use tokio::sync::mpsc;

use super::phases::CommandClock;

/// The failure of a request whose agent's channel is gone (the sandbox died or was destroyed).
pub(crate) fn sandbox_gone() -> Failure {
    Failure::new(FailureKind::SandboxGone, "the sandbox is gone")
}

/// A reply that makes no sense for the request: the channel works, so the sandbox is not gone.
pub(crate) fn unexpected(msg: &Message) -> Failure {
    Failure::new(FailureKind::Internal, format!("unexpected reply from the agent: {msg:?}"))
}

/// Where the replies to one request go.
#[derive(Clone)]
enum Route {
    /// As fast as they come: the reader never waits (every ordinary request, whose consumer keeps up or keeps a
    /// bounded amount).
    Free(mpsc::UnboundedSender<Message>),
    /// At the consumer's pace: the reader waits while this route's queue is full, so the agent's channel, and with it
    /// the agent's output, stops until the consumer catches up (a snapshot's tar stream, bounded in the server's
    /// memory whatever its size). Every other request to the same sandbox waits meanwhile.
    Paced(mpsc::Sender<Message>),
}

/// How many replies a paced route holds (each at most one 64 KiB output frame).
const PACED_REPLIES: usize = 16;

/// The receiving end of a [`Route`].
enum Replies {
    Free(mpsc::UnboundedReceiver<Message>),
    Paced(mpsc::Receiver<Message>),
}

impl Replies {
    async fn recv(&mut self) -> Option<Message> {
        match self {
            Replies::Free(receiver) => receiver.recv().await,
            Replies::Paced(receiver) => receiver.recv().await,
        }
    }
}

type Pending = Arc<Mutex<HashMap<u64, Route>>>;

/// A connection to one agent.
pub struct AgentClient {
    writer: link::Writer,
    /// Tells the reader task that its socket is being replaced.
    switches: mpsc::UnboundedSender<link::Switch>,
    pending: Pending,
    next_id: AtomicU64,
}

impl AgentClient {
    /// Takes over the host end of an agent's channel. Needs a tokio runtime (it starts the reader task).
    pub fn new(channel: OwnedFd) -> std::io::Result<AgentClient> {
        Self::with_first_id(channel, 1)
    }

    /// As [`new`](Self::new), numbering requests from `first_id`: an agent restored from a memory snapshot still
    /// holds the source's commands under the source's ids, which a new client must not reuse.
    pub fn with_first_id(channel: OwnedFd, first_id: u64) -> std::io::Result<AgentClient> {
        let (writer, mut reader, switches) = link::split(channel)?;
        let pending: Pending = Arc::default();
        let routes = Arc::clone(&pending);
        tokio::spawn(async move {
            let mut decoder = FrameDecoder::new();
            let mut buffer = vec![0u8; 64 << 10];
            loop {
                let n = reader.read(&mut buffer).await;
                if n == 0 {
                    break;
                }
                decoder.push(&buffer[..n]);
                while let Ok(Some(envelope)) = decoder.next_envelope() {
                    let route = routes.lock().ok().and_then(|map| map.get(&envelope.id).cloned());
                    match route {
                        Some(Route::Free(route)) => {
                            let _ = route.send(envelope.msg);
                        }
                        Some(Route::Paced(route)) => {
                            let _ = route.send(envelope.msg).await;
                        }
                        None => {}
                    }
                }
            }
            // The agent is gone: every waiting request learns it (its sender is dropped).
            if let Ok(mut map) = routes.lock() {
                map.clear();
            }
        });
        Ok(AgentClient { writer, switches, pending, next_id: AtomicU64::new(first_id) })
    }

    pub(super) async fn send(&self, id: u64, msg: Message) -> Result<(), Failure> {
        let frame =
            encode(&Envelope::new(id, msg)).map_err(|e| Failure::new(FailureKind::SandboxGone, e.to_string()))?;
        self.writer.write(&frame).await
    }

    /// Sends a request and returns its id and the stream of replies to it.
    pub(super) async fn start(&self, msg: Message) -> Result<(u64, mpsc::UnboundedReceiver<Message>), Failure> {
        let (tx, rx) = mpsc::unbounded_channel();
        let id = self.start_routed(msg, Route::Free(tx)).await?;
        Ok((id, rx))
    }

    /// As [`start`](Self::start), with replies delivered at the consumer's pace (see [`Route::Paced`]).
    async fn start_paced(&self, msg: Message) -> Result<(u64, mpsc::Receiver<Message>), Failure> {
        let (tx, rx) = mpsc::channel(PACED_REPLIES);
        let id = self.start_routed(msg, Route::Paced(tx)).await?;
        Ok((id, rx))
    }

    async fn start_routed(&self, msg: Message, route: Route) -> Result<u64, Failure> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.pending.lock().map_err(|_| sandbox_gone())?.insert(id, route);
        if let Err(failure) = self.send(id, msg).await {
            self.finish(id);
            return Err(failure);
        }
        Ok(id)
    }

    pub(super) fn finish(&self, id: u64) {
        if let Ok(mut map) = self.pending.lock() {
            map.remove(&id);
        }
    }

    /// A request with exactly one reply.
    async fn call(&self, msg: Message) -> Result<Message, Failure> {
        let (id, mut replies) = self.start(msg).await?;
        let reply = replies.recv().await;
        self.finish(id);
        match reply {
            Some(Message::Failed(failure)) => Err(failure),
            Some(other) => Ok(other),
            None => Err(sandbox_gone()),
        }
    }

    /// Runs a command; output chunks go to `output` as they arrive (in order; a dropped receiver is fine). Past
    /// `output_limit` bytes of a stream the agent stops reading it. The exit carries the command's phases from now.
    pub async fn exec(
        &self,
        spec: CommandSpec,
        output_limit: Option<u64>,
        output: mpsc::Sender<OutputChunk>,
    ) -> Result<CommandExit, Failure> {
        let clock = CommandClock::start();
        let (id, replies) = self.start(Message::Exec { spec, background: false, output_limit }).await?;
        self.follow_exec(id, Replies::Free(replies), clock, output).await
    }

    /// As [`exec`](Self::exec) without an output limit, the command's output read at `output`'s pace: while its
    /// receiver lags, the agent's channel waits (so do the sandbox's other requests) and so does the command.
    pub async fn exec_paced(
        &self,
        spec: CommandSpec,
        output: mpsc::Sender<OutputChunk>,
    ) -> Result<CommandExit, Failure> {
        let clock = CommandClock::start();
        let (id, replies) = self.start_paced(Message::Exec { spec, background: false, output_limit: None }).await?;
        self.follow_exec(id, Replies::Paced(replies), clock, output).await
    }

    /// A foreground command's replies until it exits.
    async fn follow_exec(
        &self,
        id: u64,
        mut replies: Replies,
        mut clock: CommandClock,
        output: mpsc::Sender<OutputChunk>,
    ) -> Result<CommandExit, Failure> {
        let outcome = loop {
            match replies.recv().await {
                Some(Message::ExecStarted { .. }) => clock.started(),
                Some(Message::Output { stream, data }) => {
                    clock.output();
                    if let Ok(data) = BASE64.decode(data) {
                        let _ = output.send(OutputChunk { stream, data }).await;
                    }
                }
                Some(Message::ExecExited { mut exit }) => {
                    exit.phases = clock.finish();
                    break Ok(exit);
                }
                Some(Message::Failed(failure)) => break Err(failure),
                Some(_) => {}
                None => break Err(sandbox_gone()),
            }
        };
        self.finish(id);
        outcome
    }

    /// Tells the agent its sandbox was paused for `paused_ns` and runs again (its commands' deadlines move on).
    pub async fn resumed(&self, paused_ns: u64) -> Result<(), Failure> {
        self.send(0, Message::Resumed { paused_ns }).await
    }

    /// Sends the file request `msg` as `user` (wrapped in `AsUser` for the sandbox's root) and waits for its reply.
    async fn file_call(&self, msg: Message, user: CommandUser) -> Result<Message, Failure> {
        match user {
            CommandUser::Sandbox => self.call(msg).await,
            CommandUser::Root => self.call(Message::AsUser { user, request: Box::new(msg) }).await,
        }
    }

    /// Reads up to `max_bytes` of a file, as `user`.
    pub async fn read_file(&self, path: &str, max_bytes: u64, user: CommandUser) -> Result<Vec<u8>, Failure> {
        const CHUNK: u64 = 1 << 20;
        let mut contents = Vec::new();
        loop {
            let offset = contents.len() as u64;
            let len = CHUNK.min(max_bytes.saturating_sub(offset).saturating_add(1));
            match self.file_call(Message::FileRead { path: path.to_owned(), offset, len }, user).await? {
                Message::FileData { data, eof } => {
                    let bytes =
                        BASE64.decode(data).map_err(|e| Failure::new(FailureKind::SandboxGone, e.to_string()))?;
                    contents.extend_from_slice(&bytes);
                    if contents.len() as u64 > max_bytes {
                        return Err(Failure::new(
                            FailureKind::TooLarge,
                            format!("{path} is larger than {max_bytes} bytes"),
                        ));
                    }
                    if eof || bytes.is_empty() {
                        return Ok(contents);
                    }
                }
                other => return Err(unexpected(&other)),
            }
        }
    }

    /// Writes a whole file (in chunks), replacing it, as `user`.
    pub async fn write_file(&self, path: &str, data: &[u8], user: CommandUser) -> Result<(), Failure> {
        const CHUNK: usize = 1 << 20;
        let mut chunks = data.chunks(CHUNK).peekable();
        let mut append = false;
        if chunks.peek().is_none() {
            let msg = Message::FileWrite { path: path.to_owned(), data: String::new(), append, mode: None };
            return self.expect_done(msg, user).await;
        }
        for chunk in chunks {
            let msg = Message::FileWrite { path: path.to_owned(), data: BASE64.encode(chunk), append, mode: None };
            self.expect_done(msg, user).await?;
            append = true;
        }
        Ok(())
    }

    async fn expect_done(&self, msg: Message, user: CommandUser) -> Result<(), Failure> {
        match self.file_call(msg, user).await? {
            Message::Done => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Lists a directory, as `user`.
    pub async fn list_dir(&self, path: &str, user: CommandUser) -> Result<Vec<FileInfo>, Failure> {
        match self.file_call(Message::FileList { path: path.to_owned() }, user).await? {
            Message::FileEntries { entries } => Ok(entries),
            other => Err(unexpected(&other)),
        }
    }

    /// Describes one path, as `user`.
    pub async fn stat(&self, path: &str, user: CommandUser) -> Result<FileInfo, Failure> {
        match self.file_call(Message::FileStat { path: path.to_owned() }, user).await? {
            Message::FileStatReply { info } => Ok(info),
            other => Err(unexpected(&other)),
        }
    }

    /// How full the sandbox's writable filesystems are.
    pub async fn disk_usage(&self) -> Result<sandkasten_types::DiskUsage, Failure> {
        match self.call(Message::DiskUsage).await? {
            Message::DiskUsageReply { usage } => Ok(usage),
            other => Err(unexpected(&other)),
        }
    }

    /// Creates a directory, as `user`.
    pub async fn mkdir(&self, path: &str, parents: bool, user: CommandUser) -> Result<(), Failure> {
        self.expect_done(Message::Mkdir { path: path.to_owned(), parents }, user).await
    }

    /// Renames a path, as `user`.
    pub async fn rename(&self, from: &str, to: &str, user: CommandUser) -> Result<(), Failure> {
        self.expect_done(Message::Rename { from: from.to_owned(), to: to.to_owned() }, user).await
    }

    /// Removes a path, as `user`.
    pub async fn remove(&self, path: &str, recursive: bool, user: CommandUser) -> Result<(), Failure> {
        self.expect_done(Message::Remove { path: path.to_owned(), recursive }, user).await
    }

    /// Replaces the metadata of a file or directory, as `user`.
    pub async fn set_metadata(&self, path: &str, metadata: FileMetadata, user: CommandUser) -> Result<(), Failure> {
        self.expect_done(Message::SetMetadata { path: path.to_owned(), metadata }, user).await
    }

    /// Watches the directory `path` (as the sandbox user; `recursive`: its subdirectories too). Once the agent has
    /// started it, its events are handed to `events` in order (a frame its receiver has no room for is dropped)
    /// until the receiver is dropped (the watch is then stopped) or the directory goes away (`events` is then
    /// dropped).
    pub async fn watch(
        self: &Arc<Self>,
        path: &str,
        recursive: bool,
        events: mpsc::Sender<Vec<FsEvent>>,
    ) -> Result<(), Failure> {
        let (id, mut replies) = self.start(Message::WatchStart { path: path.to_owned(), recursive }).await?;
        match replies.recv().await {
            Some(Message::Done) => {}
            Some(Message::Failed(failure)) => {
                self.finish(id);
                return Err(failure);
            }
            other => {
                self.finish(id);
                return Err(other.as_ref().map_or_else(sandbox_gone, unexpected));
            }
        }
        let client = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    reply = replies.recv() => match reply {
                        Some(Message::WatchEvents { events: frame }) => {
                            if matches!(events.try_send(frame), Err(mpsc::error::TrySendError::Closed(_))) {
                                break;
                            }
                        }
                        // The directory went away, or the sandbox did: the watch is over.
                        Some(Message::Failed(_)) | None => {
                            client.finish(id);
                            return;
                        }
                        Some(_) => {}
                    },
                    () = events.closed() => break,
                }
            }
            // Nobody listens any more: stop the watch (its `Done` reaches the route, which is then removed).
            let _ = client.send(id, Message::WatchStop).await;
            client.finish(id);
        });
        Ok(())
    }
}
