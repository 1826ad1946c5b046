//! A one-shot run on a tier whose agent is its own executable (gVisor): spawn → write the uploads → (compile) → one
//! exec → destroy, over the same agent protocol as long-lived sandboxes, so its result has the same fields as the
//! process tier's (exit code or signal, `timed_out`, `oom_killed`, `limit`, usage, phases).

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::Arc;

use sandkasten_cgroups::Usage;
use sandkasten_protocol::monotonic_ns;
use sandkasten_types::{
    CommandExit, CommandSpec, ErrorCode, ErrorInfo, ExecRequest, ExecResult, FailureKind, LimitKind, OutputChunk,
    OutputStream, PhaseTimings, ResourceUsage, SandboxSpec, StreamKind,
};
use tokio::sync::mpsc;

use super::runner::StdinSource;
use crate::error::RuntimeError;
use crate::guard::SandboxGuard;
use crate::live::{AgentClient, BackgroundCommand, BackgroundEvent};
use crate::output::OutputSink;
use crate::plan::{self, RunPlan};

/// How the program ended, as the host saw it.
enum End {
    Exited(CommandExit),
    CompileFailed(CommandExit),
    ExecFailed(String),
    OutputLimit,
    SandboxDied,
    /// The owner got a stop signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT).
    Interrupted(i32),
}

/// The stop signals a one-shot run ends cleanly on.
struct StopSignals(Vec<(i32, tokio::signal::unix::Signal)>);

impl StopSignals {
    fn new() -> Result<StopSignals, RuntimeError> {
        use tokio::signal::unix::{SignalKind, signal};
        let kinds = [
            (libc::SIGINT, SignalKind::interrupt()),
            (libc::SIGTERM, SignalKind::terminate()),
            (libc::SIGHUP, SignalKind::hangup()),
            (libc::SIGQUIT, SignalKind::quit()),
        ];
        kinds
            .into_iter()
            .map(|(number, kind)| signal(kind).map(|stream| (number, stream)))
            .collect::<Result<_, _>>()
            .map(StopSignals)
            .map_err(|e| RuntimeError::sys("watching stop signals", e))
    }

    /// The next stop signal's number.
    async fn recv(&mut self) -> i32 {
        let waits = self.0.iter_mut().map(|(number, stream)| {
            let number = *number;
            Box::pin(async move {
                stream.recv().await;
                number
            })
        });
        futures_select_all(waits).await
    }
}

/// The first of `futures` to finish.
async fn futures_select_all<F: std::future::Future<Output = i32> + Unpin>(futures: impl Iterator<Item = F>) -> i32 {
    let mut futures: Vec<F> = futures.collect();
    std::future::poll_fn(move |cx| {
        for future in futures.iter_mut() {
            if let std::task::Poll::Ready(number) = std::pin::Pin::new(future).poll(cx) {
                return std::task::Poll::Ready(number);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// Runs `request` once in a fresh sandbox started by `spawn` (which allocates the guard and returns the agent's
/// channel) and destroys it.
pub(crate) fn run(
    spec: &SandboxSpec,
    request: &ExecRequest,
    stdin: StdinSource<'_>,
    sink: &mut dyn OutputSink,
    started_ns: u64,
    spawn: impl FnOnce(&RunPlan) -> Result<(SandboxGuard, std::os::unix::net::UnixStream), RuntimeError>,
) -> Result<ExecResult, RuntimeError> {
    let run_plan = plan::plan(spec, request)?;
    let input = stdin_source(stdin)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| RuntimeError::sys("starting the I/O runtime", e))?;
    // Stop signals from here on end the run cleanly (the sandbox is destroyed, exit 128 + signal), as on the
    // process tier.
    let mut stop = runtime.block_on(async { StopSignals::new() })?;
    let (mut guard, channel) = spawn(&run_plan)?;
    let ready_ns = monotonic_ns();
    let limits = &spec.limits;
    let deadline_ns = started_ns.saturating_add(limits.timeout_ms.saturating_mul(1_000_000));
    let mut observed = Observed::new(limits.output_bytes);
    let flow = async {
        let agent = Arc::new(AgentClient::new(channel.into()).map_err(|e| RuntimeError::sys("agent channel", e))?);
        for upload in &run_plan.uploads {
            let path = upload.path.to_string_lossy();
            let parent = upload.path.parent().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
            let written = match agent.mkdir(&parent, true).await {
                Ok(()) => agent.write_file(&path, &upload.contents).await,
                Err(failure) => Err(failure),
            };
            if let Err(failure) = written {
                return Ok(End::ExecFailed(format!("writing {path}: {}", failure.message)));
            }
        }
        if let Some(compile) = &run_plan.compile {
            let spec = command(compile, &run_plan.env, None, deadline_ns);
            match exec(&agent, spec, &mut observed, sink, &guard).await {
                End::Exited(exit) if exit.exit_code == Some(0) => {}
                End::Exited(exit) => return Ok(End::CompileFailed(exit)),
                other => return Ok(other),
            }
        }
        let spec = command(&run_plan.program, &run_plan.env, None, deadline_ns);
        Ok::<End, RuntimeError>(run_program(&agent, spec, input, &mut observed, sink, &guard).await)
    };
    let end = runtime.block_on(async {
        tokio::select! {
            end = flow => end,
            signal = stop.recv() => Ok(End::Interrupted(signal)),
        }
    })?;
    drop(runtime);
    let finished_ns = monotonic_ns();
    guard.kill();
    guard.reap();
    let usage = guard.cgroup()?.usage()?;
    guard.release()?;
    if let End::Interrupted(signal) = end {
        return Err(RuntimeError::Interrupted(signal));
    }
    let phases = Phases { started_ns, ready_ns, first_output_ns: observed.first_output_ns, finished_ns };
    Ok(result(guard.id.clone(), end, observed, usage, limits.memory_bytes, phases))
}

/// The program's standard input: the owner's descriptor (a terminal is not forwarded), or none.
fn stdin_source(stdin: StdinSource<'_>) -> Result<Option<std::fs::File>, RuntimeError> {
    match stdin {
        StdinSource::Inherit(fd) if !rustix::termios::isatty(fd) => {
            Ok(Some(std::fs::File::from(fd.try_clone_to_owned().map_err(|e| RuntimeError::sys("dup stdin", e))?)))
        }
        _ => Ok(None),
    }
}

/// Runs the program as a command whose stdin stays open, streams `input` into it byte for byte as it is read (so an
/// endless producer works, and binary data arrives unchanged), and closes it at end of input.
async fn run_program(
    agent: &Arc<AgentClient>,
    spec: CommandSpec,
    input: Option<std::fs::File>,
    observed: &mut Observed,
    sink: &mut dyn OutputSink,
    guard: &SandboxGuard,
) -> End {
    let (handle, mut events) = match agent.spawn_background(spec).await {
        Ok(started) => started,
        Err(failure) if failure.kind == FailureKind::ExecFailed => {
            return End::ExecFailed(failure.message);
        }
        Err(_) => return End::SandboxDied,
    };
    let feeding = feed_stdin(&handle, input);
    tokio::pin!(feeding);
    let mut fed = false;
    let mut over_limit = false;
    loop {
        tokio::select! {
            () = &mut feeding, if !fed => fed = true,
            event = events.recv() => match event {
                Some(BackgroundEvent::Output(stream, bytes)) => {
                    if forward(observed, sink, stream, &bytes) && !over_limit {
                        // Past the cap: the sandbox is stopped (as on the process tier) and its command then ends.
                        over_limit = true;
                        guard.kill();
                    }
                }
                Some(BackgroundEvent::Exited(exit)) if !over_limit => return End::Exited(exit),
                Some(BackgroundEvent::Exited(_)) => return End::OutputLimit,
                None if over_limit => return End::OutputLimit,
                None => return End::SandboxDied,
            },
        }
    }
}

/// Copies `input` to the command's stdin in chunks (waiting while the agent's buffer is full), then closes it.
async fn feed_stdin(handle: &BackgroundCommand, input: Option<std::fs::File>) {
    if let Some(mut file) = input {
        let (chunks, mut received) = mpsc::channel::<Vec<u8>>(4);
        let reader = tokio::task::spawn_blocking(move || {
            let mut buffer = vec![0u8; 64 << 10];
            loop {
                match file.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if chunks.blocking_send(buffer[..n].to_vec()).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        while let Some(chunk) = received.recv().await {
            loop {
                match handle.send_stdin(&chunk).await {
                    Ok(()) => break,
                    // The program is not reading yet and the agent's buffer is full: wait, as a pipe would.
                    Err(failure) if failure.kind == FailureKind::Conflict => {
                        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    }
                    // The command ended (or closed its stdin): the rest of the input has no reader.
                    Err(_) => return,
                }
            }
        }
        drop(reader);
    }
    let _ = handle.close_stdin().await;
}

fn command(argv: &[String], env: &BTreeMap<String, String>, stdin: Option<String>, deadline_ns: u64) -> CommandSpec {
    let left_ms = deadline_ns.saturating_sub(monotonic_ns()) / 1_000_000;
    CommandSpec {
        argv: Some(argv.to_vec()),
        env: env.clone(),
        stdin,
        timeout_ms: Some(left_ms.max(1)),
        ..CommandSpec::default()
    }
}

/// Output kept for the result, capped per stream at the output limit.
struct Observed {
    stdout: OutputStream,
    stderr: OutputStream,
    limit: u64,
    first_output_ns: Option<u64>,
}

impl Observed {
    fn new(limit: u64) -> Observed {
        Observed { stdout: OutputStream::default(), stderr: OutputStream::default(), limit, first_output_ns: None }
    }

    /// Keeps `bytes` (up to the limit) and says whether the stream went past it.
    fn keep(&mut self, stream: StreamKind, bytes: &[u8]) -> bool {
        self.first_output_ns.get_or_insert_with(monotonic_ns);
        let kept = match stream {
            StreamKind::Stdout => &mut self.stdout,
            StreamKind::Stderr => &mut self.stderr,
        };
        let room = (self.limit as usize).saturating_sub(kept.bytes.len());
        kept.bytes.extend_from_slice(&bytes[..bytes.len().min(room)]);
        if bytes.len() > room {
            kept.truncated = true;
        }
        kept.truncated
    }
}

async fn exec(
    agent: &AgentClient,
    spec: CommandSpec,
    observed: &mut Observed,
    sink: &mut dyn OutputSink,
    guard: &SandboxGuard,
) -> End {
    let (chunks, mut received) = mpsc::channel(64);
    let running = agent.exec(spec, chunks);
    tokio::pin!(running);
    let mut over_limit = false;
    loop {
        tokio::select! {
            outcome = &mut running => {
                while let Ok(OutputChunk { stream, data }) = received.try_recv() {
                    over_limit |= forward(observed, sink, stream, &data);
                }
                return match outcome {
                    _ if over_limit => End::OutputLimit,
                    Ok(exit) => End::Exited(exit),
                    Err(failure) if failure.kind == FailureKind::ExecFailed => {
                        End::ExecFailed(failure.message)
                    }
                    Err(_) => End::SandboxDied,
                };
            }
            Some(OutputChunk { stream, data }) = received.recv() => {
                if forward(observed, sink, stream, &data) && !over_limit {
                    // Past the cap: the sandbox is stopped (as on the process tier) and its exec then ends.
                    over_limit = true;
                    guard.kill();
                }
            }
        }
    }
}

fn forward(observed: &mut Observed, sink: &mut dyn OutputSink, stream: StreamKind, bytes: &[u8]) -> bool {
    let before = match stream {
        StreamKind::Stdout => observed.stdout.bytes.len(),
        StreamKind::Stderr => observed.stderr.bytes.len(),
    };
    let over = observed.keep(stream, bytes);
    let after = match stream {
        StreamKind::Stdout => observed.stdout.bytes.len(),
        StreamKind::Stderr => observed.stderr.bytes.len(),
    };
    if after > before {
        sink.chunk(stream, &bytes[..after - before]);
    }
    over
}

struct Phases {
    started_ns: u64,
    ready_ns: u64,
    first_output_ns: Option<u64>,
    finished_ns: u64,
}

fn ms_since(start: u64, at: u64) -> f64 {
    at.saturating_sub(start) as f64 / 1e6
}

fn result(id: String, end: End, observed: Observed, usage: Usage, memory_limit: u64, at: Phases) -> ExecResult {
    let mut result = ExecResult { sandbox_id: id, ..ExecResult::default() };
    result.set_output(&observed.stdout, &observed.stderr);
    let died = matches!(end, End::SandboxDied);
    let agent_limit = match &end {
        End::Exited(exit) => exit.limit,
        _ => None,
    };
    // gVisor's memory is the Sentry's: when the cgroup's limit is hit the host may kill the whole sandbox rather
    // than one process, which shows as the sandbox dying with the limit's failures counted.
    result.oom_killed =
        usage.oom_kills > 0 || (died && usage.memory_peak_bytes.saturating_add(1 << 20) >= memory_limit);
    match end {
        End::Exited(exit) => {
            result.exit_code = exit.exit_code;
            result.signal = exit.signal;
            result.timed_out = exit.timed_out;
        }
        End::CompileFailed(exit) => {
            result.exit_code = exit.exit_code;
            result.signal = exit.signal;
            result.error = Some(ErrorInfo::new(
                ErrorCode::CompileError,
                "the C source did not compile; the compiler's messages are in stderr",
            ));
        }
        End::ExecFailed(message) => {
            result.exit_code = Some(if message.contains("not found") { 127 } else { 126 });
            result.error = Some(ErrorInfo::new(ErrorCode::ExecFailed, message));
        }
        End::OutputLimit | End::SandboxDied | End::Interrupted(_) => result.signal = Some(libc::SIGKILL),
    }
    if died && !result.oom_killed {
        result.error = Some(ErrorInfo::new(ErrorCode::SandboxError, "the sandbox ended without a report"));
    }
    let file_too_large = result.signal == Some(libc::SIGXFSZ);
    result.limit = if result.timed_out {
        Some(LimitKind::Time)
    } else if observed.stdout.truncated || observed.stderr.truncated {
        Some(LimitKind::Output)
    } else if result.oom_killed {
        Some(LimitKind::Memory)
    } else if file_too_large || agent_limit == Some(LimitKind::Disk) {
        Some(LimitKind::Disk)
    } else if usage.pids_limit_hits > 0 {
        Some(LimitKind::Pids)
    } else {
        None
    };
    let allocate = ms_since(at.started_ns, at.ready_ns);
    let first_command = ms_since(at.started_ns, at.first_output_ns.unwrap_or(at.finished_ns)).max(allocate);
    result.phases = PhaseTimings { allocate, filesystem_ready: allocate, runtime_ready: allocate, first_command };
    result.duration_ms = ms_since(at.started_ns, at.finished_ns).max(first_command);
    result.usage = ResourceUsage {
        cpu_user_ms: usage.cpu_user_ns / 1_000_000,
        cpu_system_ms: usage.cpu_system_ns / 1_000_000,
        memory_peak_bytes: usage.memory_peak_bytes,
    };
    result
}
