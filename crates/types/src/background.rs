//! Background commands of a long-lived sandbox as a runtime reports them: a command's status, and the events of its
//! output stream — retained output with its byte offset, then the end.

use crate::command::CommandExit;
use crate::stream::OutputChunk;

/// What is known about a background command.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandStatus {
    /// Its id (`cmd-` + 16 hex digits, chosen by the server).
    pub id: String,
    /// What it runs.
    pub argv: Vec<String>,
    /// Its pid inside the sandbox.
    pub pid: u32,
    /// Start time, ms since the Unix epoch.
    pub started_ms: i64,
    /// End time, once it ended.
    pub ended_ms: Option<i64>,
    /// How it ended (`None` while running, or when the sandbox went away before its exit was known).
    pub exit: Option<CommandExit>,
    /// Stdout went past the output limit (the first part is kept).
    pub stdout_truncated: bool,
    /// Stderr went past the output limit.
    pub stderr_truncated: bool,
}

/// An event of a background command's stream.
#[derive(Debug, Clone, PartialEq)]
pub enum CommandEvent {
    /// Retained output; `offset` is the byte offset just after it (both streams counted), from which a later stream
    /// continues.
    Output {
        /// The bytes and their stream.
        chunk: OutputChunk,
        /// Offset after these bytes.
        offset: u64,
    },
    /// The command ended; nothing follows.
    Ended(CommandStatus),
}
