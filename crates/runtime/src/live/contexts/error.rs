//! Why a code-context operation failed.

use thiserror::Error;

use crate::live::agent_client::AgentFailure;

/// A failed code-context operation.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ContextError {
    /// No such context in this sandbox.
    #[error("no code context {0} in this sandbox")]
    NotFound(String),
    /// The sandbox is not running (or died underneath the request).
    #[error("the sandbox is gone")]
    SandboxGone,
    /// The sandbox has as many contexts as it may.
    #[error("a sandbox may have at most {0} code contexts; remove one first")]
    TooMany(usize),
    /// The cell's language is not the context's.
    #[error("context {id} runs {actual}, not {requested}")]
    LanguageMismatch {
        /// The context.
        id: String,
        /// Its language.
        actual: &'static str,
        /// The request's.
        requested: &'static str,
    },
    /// The interpreter could not be started.
    #[error("{0}")]
    StartFailed(String),
    /// The agent refused a request.
    #[error("{}", .0.message)]
    Agent(AgentFailure),
    /// No random bytes for an id.
    #[error("cannot make a context id: {0}")]
    Ids(String),
}

impl From<AgentFailure> for ContextError {
    fn from(failure: AgentFailure) -> Self {
        match failure.code {
            None => ContextError::SandboxGone,
            Some(_) => ContextError::Agent(failure),
        }
    }
}
