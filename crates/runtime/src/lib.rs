//! The sandkasten runtime: turns a `SandboxSpec` and an `ExecRequest` into an `ExecResult` on one of the isolation
//! backends, with every host resource recorded durably before it is created and removed on every path; and runs
//! long-lived sandboxes behind the `SandboxRuntime` trait the HTTP server talks to (`live::LiveRuntime`).

pub mod backend;
pub mod config;
mod error;
pub mod gc;
mod guard;
mod host_pids;
mod id_ranges;
mod ids;
pub mod live;
pub mod output;
mod plan;
pub mod records;
mod retained;
mod sandbox_runtime;
pub mod spawner;
mod vm_boot;

pub use backend::microvm::{
    AccelVerdict, CLEARLY_FASTER, ProbeRun, accel_and_reason as microvm_accel, accel_verdict as microvm_accel_verdict,
    unusable as microvm_unusable,
};
pub use backend::runner::{OneShotRunner, StdinSource};
pub use config::RuntimeConfig;
pub use error::RuntimeError;
pub use host_pids::{pids_refusal, sandbox_pids_cap};
pub use output::{DiscardOutput, OutputSink};
pub use plan::{sets_variable, writable_dirs};
pub use retained::{Held, OutputBudget, OutputRetention};
pub use sandbox_runtime::{CellInterrupt, LostSandbox, RuntimeFuture, SandboxRuntime};
pub use sandkasten_agent::run_agent;
pub use sandkasten_protocol::{MAX_HOST_DOOR_STREAMS, monotonic_ns};
pub use vm_boot::VmBoot;
