//! `POST /v1/run`'s answers: the result object (the shape of `/exec`'s plus `error`), the final `exit` event of a
//! stream, and the error a run itself reports (a C source that did not compile).

use serde::Serialize;
use utoipa::ToSchema;

use sandkasten_scan::Finding;
use sandkasten_types::{CommandExit, Isolation};

use crate::api::schemas::ExecResponse;

/// What a run reports about itself (not an HTTP error: the run happened).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunErrorCode {
    /// The C source did not compile; the compiler's messages are in `stderr`, its exit code in `exit_code`.
    CompileError,
}

/// Code and message of a run's own error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct RunError {
    /// Stable code.
    pub code: RunErrorCode,
    /// What happened.
    pub message: String,
}

impl RunError {
    /// The error of a failed compile.
    pub(crate) fn compile_error(exit_code: Option<i32>) -> RunError {
        let status = exit_code.map_or_else(|| "was killed".to_owned(), |code| format!("exited with {code}"));
        RunError {
            code: RunErrorCode::CompileError,
            message: format!("the C source did not compile (gcc {status}); the compiler's messages are in stderr"),
        }
    }
}

/// The result of `POST /v1/run`: the command's result, as `/exec` answers it, and the run's own error.
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct RunResponse {
    /// The command's result (its `sandbox_id` is the sandbox the run used, destroyed by the time this is answered,
    /// `isolation` the tier it ran on; `phases` count from the request: the sandbox there (≈ 0 from a warm pool),
    /// files written, the program started, first output; `duration_ms` is the end, the compile step included).
    #[serde(flatten)]
    pub result: ExecResponse,
    /// Set when the run failed before its command (`compile_error`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
}

/// Data of the final `exit` event of a run's stream.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RunExitEvent {
    /// The sandbox the run used (destroyed by now).
    pub sandbox_id: String,
    /// The isolation it ran on: its tier, why, and (microVM) `accel`.
    pub isolation: Isolation,
    /// How it ended: exit code or signal, `timed_out`, `oom_killed`, which `limit` fired, `usage`, and `phases` from
    /// the request.
    #[serde(flatten)]
    pub exit: CommandExit,
    /// True when stdout went past the output limit (later chunks were not sent).
    pub stdout_truncated: bool,
    /// True when stderr went past the output limit.
    pub stderr_truncated: bool,
    /// Wall-clock time from the request to the end of the command (the compile step included), in milliseconds.
    pub duration_ms: f64,
    /// Set when the run failed before its command (`compile_error`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
    /// What the static scan found (policy mode `warn`, or `enforce` with nothing blocking); absent when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<Finding>,
}
