//! Turning what the host observed into the user's `ExecResult`: exit status, which limit fired, phase timings,
//! resource usage and errors.

use sandkasten_cgroups::Usage;
use sandkasten_protocol::Message;
use sandkasten_types::{ErrorCode, ErrorInfo, ExecResult, LimitKind, PhaseTimings, ResourceUsage};

use super::io_loop::{Observed, WaitEnd};

/// Everything known when an execution is over.
pub(crate) struct Outcome {
    pub(crate) id: String,
    pub(crate) end: WaitEnd,
    pub(crate) observed: Observed,
    pub(crate) usage: Usage,
    pub(crate) started_ns: u64,
    pub(crate) allocated_ns: u64,
    pub(crate) finished_ns: u64,
}

fn ms_since(start: u64, at: u64) -> f64 {
    at.saturating_sub(start) as f64 / 1e6
}

/// Builds the result. Limits are reported by precedence: time, output, memory, disk, pids.
pub(crate) fn build_result(outcome: Outcome) -> ExecResult {
    let Outcome { id, end, observed, usage, started_ns, allocated_ns, finished_ns } = outcome;
    let mut result = ExecResult { sandbox_id: id, ..ExecResult::default() };
    result.set_output(&observed.stdout.stream, &observed.stderr.stream);

    let mut filesystem_ns = None;
    let mut program_ns = None;
    let mut disk_full = false;
    for message in &observed.messages {
        match message {
            Message::FilesystemReady { at_ns } => filesystem_ns = Some(*at_ns),
            Message::ProgramStarted { at_ns, .. } => program_ns = Some(*at_ns),
            Message::Exited { exit_code, signal, disk_full: full } => {
                result.exit_code = *exit_code;
                result.signal = *signal;
                disk_full = *full;
            }
            Message::CompileFailed { exit_code, signal } => {
                result.exit_code = *exit_code;
                result.signal = *signal;
                let how = match (exit_code, signal) {
                    (_, Some(signal)) => format!("gcc was killed by signal {signal}"),
                    (code, None) => format!("gcc exited with {}", code.unwrap_or(-1)),
                };
                result.error = Some(ErrorInfo::new(
                    ErrorCode::CompileError,
                    format!("the C source did not compile ({how}); the compiler's messages are in stderr"),
                ));
            }
            Message::ExecFailed { message } => {
                result.exit_code = Some(if message.contains("not found") { 127 } else { 126 });
                result.error = Some(ErrorInfo::new(ErrorCode::ExecFailed, message.clone()));
            }
            Message::SetupFailed { message } => {
                result.error =
                    Some(ErrorInfo::new(ErrorCode::SandboxError, format!("sandbox setup failed: {message}")));
            }
            // Requests and the serve-mode replies never reach a one-shot run's result.
            _ => {}
        }
    }
    if let Some(problem) = &observed.protocol_error {
        result.error = Some(ErrorInfo::new(ErrorCode::SandboxError, format!("agent protocol error: {problem}")));
    }
    let ended_normally = result.exit_code.is_some() || result.signal.is_some() || result.error.is_some();
    if end == WaitEnd::Finished && !ended_normally {
        if usage.oom_kills > 0 {
            // The OOM killer chose the agent itself (possible where oom_score_adj cannot be lowered, i.e. without
            // CAP_SYS_RESOURCE): the sandbox died of its memory limit, which is what the caller needs to know.
            result.signal = Some(libc::SIGKILL);
        } else {
            result.error = Some(ErrorInfo::new(ErrorCode::SandboxError, "the sandbox's agent exited without a report"));
        }
    }

    result.timed_out = end == WaitEnd::TimedOut;
    result.oom_killed = usage.oom_kills > 0;
    let file_too_large = result.signal == Some(libc::SIGXFSZ);
    result.limit = match end {
        WaitEnd::TimedOut => Some(LimitKind::Time),
        WaitEnd::OutputLimit => Some(LimitKind::Output),
        _ if result.oom_killed => Some(LimitKind::Memory),
        _ if disk_full || file_too_large => Some(LimitKind::Disk),
        _ if usage.pids_limit_hits > 0 => Some(LimitKind::Pids),
        _ => None,
    };
    if matches!(end, WaitEnd::TimedOut | WaitEnd::OutputLimit) && result.signal.is_none() && result.exit_code.is_none()
    {
        result.signal = Some(libc::SIGKILL);
    }

    let allocate = ms_since(started_ns, allocated_ns);
    let filesystem_ready = filesystem_ns.map_or(allocate, |at| ms_since(started_ns, at)).max(allocate);
    let runtime_ready = program_ns.map_or(filesystem_ready, |at| ms_since(started_ns, at)).max(filesystem_ready);
    let first_command = ms_since(started_ns, observed.first_output_ns.unwrap_or(finished_ns)).max(runtime_ready);
    result.phases = PhaseTimings { allocate, filesystem_ready, runtime_ready, first_command };
    result.duration_ms = ms_since(started_ns, finished_ns).max(first_command);
    result.usage = ResourceUsage {
        cpu_user_ms: usage.cpu_user_ns / 1_000_000,
        cpu_system_ms: usage.cpu_system_ns / 1_000_000,
        memory_peak_bytes: usage.memory_peak_bytes,
    };
    result
}
