//! The messages exchanged between the host and the agent (PID 1 inside the sandbox).
//!
//! A sandbox starts with the lifecycle messages (`Plan`, and on the process tier `Start` and `CgroupJoined`, answered
//! by `FilesystemReady` or `SetupFailed`, all with id 0). Then the agent serves requests from the host — one-shot runs
//! and long-lived sandboxes alike — each answered by exactly one terminal reply carrying the request's envelope id:
//!
//! | request | reply |
//! |---|---|
//! | `Exec` | `ExecStarted` (then `Output`* and one `ExecExited`) or `Failed` |
//! | `StdinData`, `StdinClose`, `Signal`, `Resize` (id = the command's id) | `Done` or `Failed` |
//! | `StopOutput` (id = the command's id), `Resumed` | none |
//! | `ListCommands` | `Commands` |
//! | `Quiesce` | `Done` |
//! | `FileRead` | `FileData` or `Failed` |
//! | `FileWrite`, `Mkdir`, `Rename`, `Remove`, `SetMetadata` | `Done` or `Failed` |
//! | `AsUser` (holding one of the file requests above) | that request's reply |
//! | `FileList` | `FileEntries` or `Failed` |
//! | `FileStat` | `FileStatReply` or `Failed` |
//! | `DiskUsage` | `DiskUsageReply` or `Failed` |
//! | `WatchStart` (id = the watch's id) | `Done` (then `WatchEvents`*, and `Failed` if its directory goes away) or `Failed` |
//! | `WatchStop` (id = the watch's id) | `Done`; nothing more about the id follows |
//! | `PortOpen` (id = the stream's id) | `Done` once connected (then `PortData`*, `PortAck`*, `PortEof`, and `Failed` if the connection breaks) or `Failed` |
//! | `PortData`, `PortAck`, `PortEof`, `PortClose` (id = the stream's id) | none |
//! | `Shutdown` | `Done`, then the agent exits |
//!
//! Byte payloads (`data`) are standard base64 with padding.
//!
//! A port stream (`PortOpen`) is a TCP connection the agent opens to `127.0.0.1:port` inside the sandbox; its bytes
//! travel both ways as `PortData`, with credit-based flow control: neither side has more than
//! `PORT_WINDOW_BYTES` of a stream sent and not yet acknowledged (`PortAck`, sent as the receiver passes bytes on).
//! `PortEof` ends a direction (a half-close); the stream is over once both have ended, when either side fails it
//! (the agent's `Failed`, the host's `PortClose`), or with the sandbox.

use serde::{Deserialize, Serialize};

use sandkasten_types::{
    CommandExit, CommandSpec, CommandUser, DiskUsage, Failure, FileInfo, FileMetadata, FsEvent, PtySize, StreamKind,
};

use crate::plan::AgentPlan;
use crate::serve_types::RunningCommand;

/// The protocol version this build speaks. A peer with another version is refused with a clear error.
pub const PROTOCOL_VERSION: u16 = 1;

/// A message with its version and request id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// Protocol version of the sender.
    pub v: u16,
    /// Request id this message belongs to (0 for the sandbox's own lifecycle). For `Exec` it is the command's id, and
    /// every later message about that command carries it.
    pub id: u64,
    /// The message.
    pub msg: Message,
}

impl Envelope {
    /// Wraps a message in an envelope of this protocol version.
    pub fn new(id: u64, msg: Message) -> Self {
        Envelope { v: PROTOCOL_VERSION, id, msg }
    }
}

/// Everything the host and the agent say to each other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    /// host → guest agent (an agent that is its own executable: gVisor, microVM): the whole plan; the agent answers
    /// `FilesystemReady` once it serves, or `SetupFailed`.
    Plan {
        /// What to serve and how to confine commands (boxed: the largest message by far, sent once).
        plan: Box<AgentPlan>,
    },
    /// host → process-tier starter: ids are mapped; become the namespace's root and execute the agent.
    Start,
    /// host → agent (process tier): the agent is in the sandbox's cgroup; it may serve. (Sent after `Plan` so that
    /// the host's cgroup attach, which costs an RCU grace period on cgroup v1, overlaps the agent's filesystem build.)
    CgroupJoined,
    /// agent → host: the root filesystem is mounted and pivoted into.
    FilesystemReady {
        /// CLOCK_MONOTONIC, ns.
        at_ns: u64,
    },
    /// microVM guest agent → host, its first frame: the guest kernel booted and the agent holds its port open, so the
    /// plan may be sent (a virtio-serial port drops what arrives before the guest opens it).
    GuestBooted {
        /// The guest's CLOCK_MONOTONIC, ns (its time since boot).
        at_ns: u64,
    },
    /// agent → host: a containment step failed; the sandbox is unusable.
    SetupFailed {
        /// Which step failed and why.
        message: String,
    },

    /// host → agent: start a command; the envelope id becomes the command's id.
    Exec {
        /// What to run.
        spec: CommandSpec,
        /// Keep stdin open after `spec.stdin` for `StdinData`/`StdinClose` (a foreground command's stdin is closed
        /// after `spec.stdin`).
        background: bool,
        /// Bytes of each output stream the host keeps. Once the agent has sent more than this of a stream it sends
        /// no more of it: the rest is read and discarded inside the sandbox (the writer is not stopped), so output
        /// nobody keeps costs the host nothing. `None`: send everything.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output_limit: Option<u64>,
    },
    /// host → agent: bytes for a running command's stdin.
    StdinData {
        /// Base64.
        data: String,
    },
    /// host → agent: close a running command's stdin (after what is buffered has been written).
    StdinClose,
    /// host → agent: send a signal to a running command's process group.
    Signal {
        /// Signal number (1..=64).
        signal: i32,
    },
    /// host → agent: give a command's pseudo-terminal (`spec.pty`) a new size; its foreground process group gets
    /// `SIGWINCH`. A command without one is `Failed`.
    Resize {
        /// The new size.
        size: PtySize,
    },
    /// host → agent: the host keeps no more of this stream of the command with this id (its output budget ran
    /// out): discard the rest of it. No reply; an id that is not running is ignored.
    StopOutput {
        /// Which stream.
        stream: StreamKind,
    },
    /// host → agent (id 0): the sandbox was paused for this long and runs again; the agent moves its commands'
    /// deadlines on by as much (a pause does not count against a command's timeout) and opens connections to the
    /// host again after a `Quiesce`. No reply.
    Resumed {
        /// How long it was paused, in nanoseconds.
        paused_ns: u64,
    },
    /// host → agent: a checkpoint follows (gVisor's pause, or a memory snapshot): close every connection to a host
    /// socket except this channel (the egress door's; runsc cannot save one) and open none, and report no command
    /// output or exit, until `Resumed`. Answered `Done` once they are closed, after every request sent before it was
    /// read; nothing follows the `Done` until then, so the channel holds no partial frame at the checkpoint.
    Quiesce,
    /// host → agent: which commands are running.
    ListCommands,
    /// host → agent: read part of a regular file.
    FileRead {
        /// Absolute path inside the sandbox.
        path: String,
        /// First byte to read.
        offset: u64,
        /// Bytes wanted; the agent returns at most `MAX_FILE_CHUNK_BYTES` per reply.
        len: u64,
    },
    /// host → agent: write a regular file (create or truncate it, or append for chunked uploads).
    FileWrite {
        /// Absolute path inside the sandbox.
        path: String,
        /// Base64.
        data: String,
        /// Append instead of truncating.
        append: bool,
        /// Permission bits for a file this write creates (default 0o644).
        mode: Option<u32>,
    },
    /// host → agent: the entries of a directory (not recursive, symlinks not followed).
    FileList {
        /// Absolute path inside the sandbox.
        path: String,
    },
    /// host → agent: metadata of one path (a symlink itself, not its target).
    FileStat {
        /// Absolute path inside the sandbox.
        path: String,
    },
    /// host → agent: create a directory.
    Mkdir {
        /// Absolute path inside the sandbox.
        path: String,
        /// Create missing parents; an existing directory is then no error.
        parents: bool,
    },
    /// host → agent: rename a path (both ends inside the sandbox).
    Rename {
        /// Absolute source path.
        from: String,
        /// Absolute destination path.
        to: String,
    },
    /// host → agent: remove a file, symlink or directory.
    Remove {
        /// Absolute path inside the sandbox.
        path: String,
        /// Remove a directory with its contents (symlinks are removed, never followed).
        recursive: bool,
    },
    /// host → agent: replace the user metadata of a regular file or directory (its `user.e2b.*` extended
    /// attributes) with `metadata`: keys it does not hold are removed, so an empty map clears it. Metadata that
    /// `check_metadata` refuses is `invalid_input`; a filesystem without user extended attributes is `unsupported`.
    SetMetadata {
        /// Absolute path inside the sandbox (a final symlink is not followed).
        path: String,
        /// The new metadata.
        metadata: FileMetadata,
    },
    /// host → agent: run the file request `request` (`FileRead`, `FileWrite`, `FileList`, `FileStat`, `Mkdir`,
    /// `Rename`, `Remove`, `SetMetadata`) as `user` instead of the sandbox user. The sandbox's root is uid and gid 0
    /// inside the sandbox's user namespace with no capability in effect while the request runs, as a command run as
    /// root has none: it gets what the ids allow, nothing more. Anything else inside is `Failed`.
    AsUser {
        /// Who the request acts as.
        user: CommandUser,
        /// The file request.
        request: Box<Message>,
    },
    /// host → agent: how full the sandbox's writable filesystems are (home, `/tmp`, `/dev/shm`).
    DiskUsage,
    /// host → agent: watch a directory (inotify, as the sandbox user) and report what happens under it as
    /// `WatchEvents` with this envelope id until `WatchStop`.
    WatchStart {
        /// Absolute path of a directory inside the sandbox.
        path: String,
        /// Its subdirectories too, also those created later.
        recursive: bool,
    },
    /// host → agent: stop the watch with this id.
    WatchStop,
    /// host → agent: connect to `127.0.0.1:port` inside the sandbox (its own network namespace or network stack);
    /// the envelope id becomes the stream's id. `Done` once connected; `Failed` (`nothing_listening`) when nothing
    /// listens there, (`conflict`) when the sandbox has `MAX_PORT_STREAMS` open.
    PortOpen {
        /// The port inside the sandbox (1..=65535).
        port: u16,
    },
    /// both ways: bytes of the port stream with this id, in order.
    PortData {
        /// Base64 of at most `MAX_PORT_CHUNK_BYTES` raw bytes.
        data: String,
    },
    /// both ways: this many more bytes of the stream were passed on by the receiver (the sender may send as many
    /// more).
    PortAck {
        /// Bytes passed on since the last acknowledgement.
        bytes: u64,
    },
    /// both ways: the sender sends no more data on this stream (its write side is shut down).
    PortEof,
    /// host → agent: the host's end of the stream is gone: close the connection at once (nothing more about the id
    /// follows).
    PortClose,
    /// host → agent: kill every command, answer `Done` and exit.
    Shutdown,

    /// agent → host: the command's execve succeeded.
    ExecStarted {
        /// Its pid inside the sandbox (also its process group id).
        pid: u32,
    },
    /// agent → host: output of a command, in order per stream.
    Output {
        /// Which stream.
        stream: StreamKind,
        /// Base64 of at most `MAX_OUTPUT_CHUNK_BYTES` raw bytes.
        data: String,
    },
    /// agent → host: the command ended and its output is complete; the last message about this id.
    ExecExited {
        /// How it ended.
        exit: CommandExit,
    },
    /// agent → host: the commands that have not been reported as exited yet.
    Commands {
        /// Sorted by id.
        running: Vec<RunningCommand>,
    },
    /// agent → host: part of a file.
    FileData {
        /// Base64.
        data: String,
        /// The file ends with this chunk.
        eof: bool,
    },
    /// agent → host: a directory's entries.
    FileEntries {
        /// Sorted by name.
        entries: Vec<FileInfo>,
    },
    /// agent → host: metadata of one path.
    FileStatReply {
        /// The metadata.
        info: FileInfo,
    },
    /// agent → host: how full the writable filesystems are.
    DiskUsageReply {
        /// Their fill, added up.
        usage: DiskUsage,
    },
    /// agent → host: events of the watch with this id, in order.
    WatchEvents {
        /// At most `MAX_WATCH_EVENTS_PER_FRAME`.
        events: Vec<FsEvent>,
    },
    /// agent → host: the request succeeded (requests without a payload in their answer).
    Done,
    /// agent → host: the request failed (`{"type": "failed", "kind": "not_found", "message": "…"}`).
    Failed(Failure),
}
