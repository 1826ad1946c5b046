//! The `Backend` trait: one isolation tier. Each tier runs the same agent and speaks the same protocol; only the
//! mechanism and the transport differ.

pub mod gvisor;
pub(crate) mod oneshot;

use sandkasten_types::{ExecRequest, ExecResult, SandboxSpec};

use crate::error::RuntimeError;
use crate::output::OutputSink;

/// An isolation tier.
pub trait Backend {
    /// The tier's name (`process`, `gvisor`, `microvm`).
    fn name(&self) -> &'static str;

    /// Creates a sandbox for `spec`, runs `request` in it, destroys it, and returns the result. Live output goes to
    /// `sink` as it arrives. `started_ns` is the request's arrival on CLOCK_MONOTONIC; phases are measured from it.
    fn run_once(
        &self,
        spec: &SandboxSpec,
        request: &ExecRequest,
        sink: &mut dyn OutputSink,
        started_ns: u64,
    ) -> Result<ExecResult, RuntimeError>;
}
