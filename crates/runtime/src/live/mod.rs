//! Long-lived sandboxes for an async owner (the server): the spawner creates them, and each agent is then driven over
//! its protocol channel by an `AgentClient` — commands with streamed output, background commands, file operations —
//! connections to its ports (`agent_client/ports`), and code-interpreter contexts run as background kernels (`contexts`); background commands started through the API
//! are kept per sandbox with their retained output (`commands`). `LiveRuntime` implements the server's
//! `SandboxRuntime` (`sandbox_runtime`).

mod agent_client;
mod archive;
mod background;
pub mod commands;
pub mod contexts;
mod limits;
mod phases;
mod runtime;
mod sandbox_runtime;
mod supervisor;
mod tar_stderr;
mod vm_door;

pub use agent_client::{AgentClient, PortStream};
pub use background::{BackgroundCommand, BackgroundEvent};
pub use commands::BackgroundCommands;
pub use contexts::Contexts;
pub use runtime::LiveRuntime;
