//! The sandkasten runtime: turns a `SandboxSpec` and an `ExecRequest` into an `ExecResult` on one of the isolation
//! backends, with every host resource recorded durably before it is created and removed on every path.

mod backend;
pub mod config;
mod error;
pub mod gc;
mod guard;
mod ids;
mod io_loop;
mod launch;
pub mod live;
pub mod output;
mod plan;
mod process_backend;
pub mod records;
mod result;
pub mod spawner;
mod stdin_pump;

pub use backend::Backend;
pub use config::RuntimeConfig;
pub use error::RuntimeError;
pub use output::{DiscardOutput, OutputSink, StreamKind};
pub use process_backend::{ProcessBackend, StdinSource};
pub use sandkasten_agent::run_guest as run_guest_agent;
pub use sandkasten_protocol::monotonic_ns;
