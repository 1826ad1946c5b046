//! Long-lived sandboxes for an async owner (the server): the spawner creates them, and each agent is then driven over
//! its protocol channel by an `AgentClient` — commands with streamed output, and file operations.

mod agent_client;
mod runtime;

pub use agent_client::{AgentClient, AgentFailure};
pub use runtime::LiveRuntime;
