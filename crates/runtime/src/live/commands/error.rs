//! Why a background-command operation failed.

use thiserror::Error;

use crate::live::agent_client::AgentFailure;

/// A failed background-command operation.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CommandError {
    /// No such command in this sandbox (never started, or forgotten).
    #[error("no command {0} in this sandbox")]
    NotFound(String),
    /// The sandbox is not running (or died underneath the request).
    #[error("the sandbox is gone")]
    SandboxGone,
    /// The command has ended: it takes no more stdin or signals.
    #[error("command {0} has ended")]
    Ended(String),
    /// The command's stdin was closed before.
    #[error("the stdin of command {0} is closed")]
    StdinClosed(String),
    /// The sandbox runs as many background commands as it may.
    #[error("a sandbox runs at most {0} background commands at once; wait for one to end or kill one")]
    TooMany(usize),
    /// The command id is taken.
    #[error("command {0} exists already")]
    Duplicate(String),
    /// The agent refused a request.
    #[error("{}", .0.message)]
    Agent(AgentFailure),
}

impl From<AgentFailure> for CommandError {
    fn from(failure: AgentFailure) -> Self {
        match failure.code {
            None => CommandError::SandboxGone,
            Some(_) => CommandError::Agent(failure),
        }
    }
}
