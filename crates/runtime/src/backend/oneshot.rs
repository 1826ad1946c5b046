//! A one-shot run on any tier: allocate → spawn (the tier's backend) → write the uploads → (compile) → one exec →
//! destroy, over the same agent protocol as long-lived sandboxes, so its result has the same fields everywhere (exit
//! code or signal, `timed_out`, `oom_killed`, `limit`, usage, phases). The host keeps its own deadline too: an agent
//! that does not report the program's end in time is not waited for.

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use sandkasten_cgroups::Usage;
use sandkasten_protocol::monotonic_ns;
use sandkasten_types::{
    CommandExit, CommandSpec, CommandUser, ErrorCode, ErrorInfo, ExecRequest, ExecResult, FailureKind, Isolation,
    LimitKind, OutputChunk, PhaseTimings, ResourceUsage, SandboxSpec, StreamKind,
};
use tokio::sync::mpsc;

use super::TierBackend;
use super::process::launch::{self, Launcher};
use super::runner::StdinSource;
use crate::error::RuntimeError;
use crate::guard::SandboxGuard;
use crate::ids;
use crate::live::{AgentClient, BackgroundCommand, BackgroundEvent};
use crate::output::{Capture, OutputSink};
use crate::plan;

/// How the program ended, as the host saw it.
enum End {
    Exited(CommandExit),
    CompileFailed(CommandExit),
    ExecFailed(String),
    OutputLimit,
    SandboxDied,
    /// The agent had not reported the program's end by the deadline (plus `AGENT_GRACE`).
    Unanswered,
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

/// How long past the run's deadline the host waits for the agent to report the program's end before it destroys the
/// sandbox itself (an agent that cannot answer — stopped, starved — must not hold the run open).
const AGENT_GRACE: Duration = Duration::from_secs(2);

/// Runs `request` once in a fresh sandbox that `launcher` allocates and `backend` spawns, and destroys it.
pub(crate) fn run(
    spec: &SandboxSpec,
    request: &ExecRequest,
    stdin: StdinSource<'_>,
    sink: &mut dyn OutputSink,
    started_ns: u64,
    launcher: &Launcher<'_>,
    backend: &dyn TierBackend,
) -> Result<ExecResult, RuntimeError> {
    let run_plan = plan::plan(spec, request)?;
    let input = stdin_source(stdin)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| RuntimeError::sys("starting the I/O runtime", e))?;
    // Stop signals from here on end the run cleanly (the sandbox is destroyed, exit 128 + signal).
    let mut stop = runtime.block_on(async { StopSignals::new() })?;
    let id = ids::new_sandbox_id()?;
    let mut guard = launcher.allocate(&id, spec)?;
    let mut at = Phases { started_ns, allocated_ns: monotonic_ns(), ..Phases::default() };
    let mut agent_plan = plan::agent_plan(spec, run_plan.clone(), launch::own_oom_score_adj());
    // A local run has no network at all (no egress proxy listens on the host): no door to open.
    agent_plan.door = None;
    let channel = backend.spawn(&mut guard, spec, &run_plan.files, &agent_plan)?;
    at.vm_boot = guard.vm_boot;
    let limits = &spec.limits;
    // The wall timeout counts the run's own time: not a microVM's boot (launch to the guest's greeting), which takes
    // seconds under software emulation, more on a loaded host, and is bounded by itself (the spawn's ready timeout).
    let boot_ns = at.vm_boot.map_or(0, |vm| vm.booted_ns.saturating_sub(vm.launched_ns));
    let deadline_ns = started_ns.saturating_add(boot_ns).saturating_add(limits.timeout_ms.saturating_mul(1_000_000));
    let mut observed = Observed::new(limits.output_bytes);
    let flow = async {
        let agent = Arc::new(AgentClient::new(channel.into()).map_err(|e| RuntimeError::sys("agent channel", e))?);
        for upload in &run_plan.uploads {
            let path = upload.path.to_string_lossy();
            let parent = upload.path.parent().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
            let written = match agent.mkdir(&parent, true, CommandUser::Sandbox).await {
                Ok(()) => agent.write_file(&path, &upload.contents, CommandUser::Sandbox).await,
                Err(failure) => Err(failure),
            };
            if let Err(failure) = written {
                return Ok(End::ExecFailed(format!("writing {path}: {}", failure.message)));
            }
        }
        at.files_ready_ns = monotonic_ns();
        if let Some(compile) = &run_plan.compile {
            let spec = command(compile, &run_plan.env, None, deadline_ns);
            match exec(&agent, spec, &mut observed, sink, &guard).await {
                End::Exited(exit) if exit.exit_code == Some(0) => {}
                End::Exited(exit) => return Ok(End::CompileFailed(exit)),
                other => return Ok(other),
            }
        }
        let spec = command(&run_plan.program, &run_plan.env, None, deadline_ns);
        let program = Program { agent: &agent, guard: &guard, started_ns: &mut at.program_started_ns };
        Ok::<End, RuntimeError>(program.run(spec, input, &mut observed, sink).await)
    };
    let backstop = Duration::from_nanos(deadline_ns.saturating_sub(monotonic_ns())) + AGENT_GRACE;
    let end = runtime.block_on(async {
        tokio::select! {
            end = flow => end,
            signal = stop.recv() => Ok(End::Interrupted(signal)),
            () = tokio::time::sleep(backstop) => Ok(End::Unanswered),
        }
    })?;
    drop(runtime);
    at.finished_ns = monotonic_ns();
    at.first_output_ns = observed.first_output_ns;
    guard.kill();
    guard.reap();
    let usage = guard.cgroup()?.usage()?;
    guard.release()?;
    if let End::Interrupted(signal) = end {
        return Err(RuntimeError::Interrupted(signal));
    }
    let mut result = result(guard.id.clone(), end, observed, usage, limits.memory_bytes, at);
    result.isolation.tier = spec.tier();
    Ok(result)
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

/// The program's command, and where its start is noted.
struct Program<'a> {
    agent: &'a Arc<AgentClient>,
    guard: &'a SandboxGuard,
    started_ns: &'a mut Option<u64>,
}

impl Program<'_> {
    /// Runs the program as a command whose stdin stays open, streams `input` into it byte for byte as it is read (so
    /// an endless producer works, and binary data arrives unchanged), and closes it at end of input.
    async fn run(
        self,
        spec: CommandSpec,
        input: Option<std::fs::File>,
        observed: &mut Observed,
        sink: &mut dyn OutputSink,
    ) -> End {
        let (handle, mut events) = match self.agent.spawn_background(spec, Some(observed.limit)).await {
            Ok(started) => started,
            Err(failure) if failure.kind == FailureKind::ExecFailed => {
                return End::ExecFailed(failure.message);
            }
            Err(_) => return End::SandboxDied,
        };
        *self.started_ns = Some(monotonic_ns());
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
                            // Past the cap: the sandbox is stopped and its command then ends.
                            over_limit = true;
                            self.guard.kill();
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
                    Err(failure) if failure.kind == FailureKind::StdinFull => {
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
    stdout: Capture,
    stderr: Capture,
    first_output_ns: Option<u64>,
    limit: u64,
}

impl Observed {
    fn new(limit: u64) -> Observed {
        Observed { stdout: Capture::new(limit), stderr: Capture::new(limit), first_output_ns: None, limit }
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
    let running = agent.exec(spec, Some(observed.limit), chunks);
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

/// Keeps `bytes` (up to the limit), passes what was kept to the sink, and says whether the stream went past it.
fn forward(observed: &mut Observed, sink: &mut dyn OutputSink, stream: StreamKind, bytes: &[u8]) -> bool {
    observed.first_output_ns.get_or_insert_with(monotonic_ns);
    let capture = match stream {
        StreamKind::Stdout => &mut observed.stdout,
        StreamKind::Stderr => &mut observed.stderr,
    };
    let (kept, over) = capture.append(bytes);
    if !kept.is_empty() {
        sink.chunk(stream, kept);
    }
    over
}

/// When each step of the run ended (CLOCK_MONOTONIC, ns).
#[derive(Default)]
struct Phases {
    /// The request.
    started_ns: u64,
    /// Record and cgroup.
    allocated_ns: u64,
    /// The agent serves in its root and the uploads are written (0: the run ended before).
    files_ready_ns: u64,
    /// How the microVM's guest started, and when it had booted (microvm tier only).
    vm_boot: Option<crate::VmBoot>,
    /// The program's execve succeeded.
    program_started_ns: Option<u64>,
    first_output_ns: Option<u64>,
    finished_ns: u64,
}

fn ms_since(start: u64, at: u64) -> f64 {
    at.saturating_sub(start) as f64 / 1e6
}

fn result(id: String, end: End, observed: Observed, usage: Usage, memory_limit: u64, at: Phases) -> ExecResult {
    let mut result = ExecResult { sandbox_id: id, ..ExecResult::default() };
    result.set_output(&observed.stdout.stream, &observed.stderr.stream);
    let died = matches!(end, End::SandboxDied);
    let unanswered = matches!(end, End::Unanswered);
    let agent_limit = match &end {
        End::Exited(exit) => exit.limit,
        _ => None,
    };
    // gVisor's memory is the Sentry's: when the cgroup's limit is hit the host may kill the whole sandbox rather
    // than one process, which shows as the sandbox dying with the limit's failures counted.
    // A microVM's guest kernel kills inside the VM: its agent says so.
    let guest_oom = matches!(&end, End::Exited(exit) if exit.oom_killed);
    result.oom_killed =
        guest_oom || usage.oom_kills > 0 || (died && usage.memory_peak_bytes.saturating_add(1 << 20) >= memory_limit);
    match end {
        End::Exited(exit) => {
            result.exit_code = exit.exit_code;
            result.signal = exit.signal;
            result.timed_out = exit.timed_out;
        }
        End::CompileFailed(exit) => {
            result.exit_code = exit.exit_code;
            result.signal = exit.signal;
            let how = match (exit.exit_code, exit.signal) {
                (_, Some(signal)) => format!("gcc was killed by signal {signal}"),
                (code, None) => format!("gcc exited with {}", code.unwrap_or(-1)),
            };
            result.error = Some(ErrorInfo::new(
                ErrorCode::CompileError,
                format!("the C source did not compile ({how}); the compiler's messages are in stderr"),
            ));
        }
        End::ExecFailed(message) => {
            result.exit_code = Some(if message.contains("not found") { 127 } else { 126 });
            result.error = Some(ErrorInfo::new(ErrorCode::ExecFailed, message));
        }
        End::OutputLimit | End::SandboxDied | End::Unanswered | End::Interrupted(_) => {
            result.signal = Some(libc::SIGKILL)
        }
    }
    if died && !result.oom_killed {
        result.error = Some(ErrorInfo::new(ErrorCode::SandboxError, "the sandbox ended without a report"));
    }
    let file_too_large = result.signal == Some(libc::SIGXFSZ);
    // The agent did not report by the deadline (plus grace): the host destroyed the sandbox at its time limit.
    result.timed_out |= unanswered;
    result.limit = if result.timed_out {
        Some(LimitKind::Time)
    } else if observed.stdout.stream.truncated || observed.stderr.stream.truncated {
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
    let allocate = ms_since(at.started_ns, at.allocated_ns);
    let vm_boot = at.vm_boot.map_or(0.0, |vm| ms_since(at.started_ns, vm.booted_ns).max(allocate));
    let filesystem_ready = ms_since(at.started_ns, at.files_ready_ns).max(allocate).max(vm_boot);
    let runtime_ready = at.program_started_ns.map_or(filesystem_ready, |ns| ms_since(at.started_ns, ns));
    let runtime_ready = runtime_ready.max(filesystem_ready);
    let first_command = ms_since(at.started_ns, at.first_output_ns.unwrap_or(at.finished_ns)).max(runtime_ready);
    result.phases = PhaseTimings { allocate, vm_boot, filesystem_ready, runtime_ready, first_command };
    result.isolation = Isolation {
        reason: Isolation::REQUESTED.to_owned(),
        accel: at.vm_boot.map(|vm| vm.accel),
        ..Isolation::default()
    };
    result.duration_ms = ms_since(at.started_ns, at.finished_ns).max(first_command);
    result.usage = ResourceUsage {
        cpu_user_ms: usage.cpu_user_ns / 1_000_000,
        cpu_system_ms: usage.cpu_system_ns / 1_000_000,
        memory_peak_bytes: usage.memory_peak_bytes,
    };
    result
}
