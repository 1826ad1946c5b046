//! The messages exchanged between the host and the agent (PID 1 inside the sandbox).

use serde::{Deserialize, Serialize};

/// The protocol version this build speaks. A peer with another version is refused with a clear error.
pub const PROTOCOL_VERSION: u16 = 1;

/// A message with its version and request id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// Protocol version of the sender.
    pub v: u16,
    /// Request id this message belongs to (0 for the sandbox's own lifecycle).
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    /// host → agent: ids are mapped and the agent is in its cgroup; build the sandbox and run.
    Start,
    /// host → agent: the agent is in the sandbox's cgroup; it may run the program. (Sent after `Start` so that the
    /// host's cgroup attach, which costs an RCU grace period on cgroup v1, overlaps the agent's filesystem build.)
    CgroupJoined,
    /// agent → host: the root filesystem is mounted and pivoted into.
    FilesystemReady {
        /// CLOCK_MONOTONIC, ns.
        at_ns: u64,
    },
    /// agent → host: the program's execve succeeded.
    ProgramStarted {
        /// CLOCK_MONOTONIC, ns.
        at_ns: u64,
        /// The program's pid inside the sandbox.
        pid: u32,
    },
    /// agent → host: the compile step (C) failed; its messages went to stderr.
    CompileFailed {
        /// The compiler's exit code.
        exit_code: Option<i32>,
        /// Or the signal that killed it.
        signal: Option<i32>,
    },
    /// agent → host: the program ended.
    Exited {
        /// Exit code when it exited normally.
        exit_code: Option<i32>,
        /// Signal number when it was killed by a signal.
        signal: Option<i32>,
        /// A writable filesystem (`/workspace` or `/tmp`) was full when it ended.
        disk_full: bool,
    },
    /// agent → host: the program could not be started (not found, not executable).
    ExecFailed {
        /// What failed, for the user.
        message: String,
    },
    /// agent → host: a containment step failed; the sandbox is unusable.
    SetupFailed {
        /// Which step failed and why.
        message: String,
    },
}
