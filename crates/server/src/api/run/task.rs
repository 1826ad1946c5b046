//! The work of one `POST /v1/run`, in its own task so that the request going away cannot skip the cleanup: create the
//! sandbox, write the files, compile (C), run, and destroy the sandbox on every path. A client that leaves (its
//! receiver dropped) ends the run early; the sandbox is destroyed before the result is sent.
//!
//! Python or Node code (without env or stdin) that lands on a pool member with a zygote of its language is not
//! started as `python3 /tmp/main.py` or `node /tmp/main.js`: the zygote's stdin gets the Python source (the zygote
//! forks a child that runs it) or the Node program's path (the zygote runs it as its main module), then EOF; the
//! zygote's output is the run's, its exit the run's exit. The run's time limit kills the zygote's process group
//! (SIGKILL). A zygote that is not usable (it died) leaves the run to the ordinary path; one that is not for this run
//! (another language, or a run with env or stdin) is killed first. The member's spare code-context kernel is discarded
//! in either case.

use std::time::{Duration, Instant};

use sandkasten_types::{CommandEvent, CommandExit, CommandSpec, Failure, FailureKind, Isolation, OutputChunk};
use tokio::sync::{mpsc, oneshot};

use crate::api::error::ApiError;
use crate::api::extract::runtime_error;
use crate::api::run::phases::{RunClock, mark_program};
use crate::api::run::request::RunPlan;
use crate::api::run::response::RunError;
use crate::auth::Tenant;
use crate::clock::now_ms;
use crate::config::ZygoteKind;
use crate::lifecycle::{SIGKILL, finish_run, start_sandbox_with_zygote};
use crate::state::AppState;
use crate::store::Lifecycle;
use sandkasten_types::LimitKind;

/// How a run ended, when it got to run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunOutcome {
    /// How the command (or the failed compile) ended; its `phases` count from the request (set at the run's end).
    pub(crate) exit: CommandExit,
    /// Compile error.
    pub(crate) compile_failed: bool,
    /// From the request to the end of the command, in milliseconds (set at the run's end).
    pub(crate) duration_ms: f64,
}

impl RunOutcome {
    /// The outcome of a run whose command (or compile step) ended with `exit`.
    fn new(exit: CommandExit, compile_failed: bool) -> RunOutcome {
        RunOutcome { exit, compile_failed, duration_ms: 0.0 }
    }

    /// The run's own error, if any.
    pub(crate) fn error(&self) -> Option<RunError> {
        self.compile_failed.then(|| RunError::compile_error(self.exit.exit_code))
    }
}

/// What the task reports after the sandbox is ready: output as it comes, then the end.
#[derive(Debug)]
pub(crate) enum RunEvent {
    /// A chunk of the compile step's or the command's output.
    Output(OutputChunk),
    /// The end; the sandbox is destroyed by now.
    Done(Result<RunOutcome, ApiError>),
}

/// Channels of a started run: `ready` answers once the sandbox exists and holds the files (or why not), `events`
/// carries the output and the end.
pub(crate) struct Started {
    pub(crate) ready: oneshot::Receiver<Result<(String, Isolation), ApiError>>,
    pub(crate) events: mpsc::Receiver<RunEvent>,
}

/// Starts a run in its own task; `requested` is when its request arrived (the phases count from there).
pub(crate) fn spawn(
    state: AppState,
    tenant: Tenant,
    plan: RunPlan,
    requested: Instant,
    starting: Option<Starting>,
) -> Started {
    let (ready_sender, ready) = oneshot::channel();
    let (event_sender, events) = mpsc::channel(64);
    let clock = RunClock::new(requested);
    tokio::spawn(run(state, tenant, plan, clock, (ready_sender, event_sender), starting));
    Started { ready, events }
}

/// What keeps the layers of a run naming a built template from a removal until its sandbox is started.
type Starting = crate::template_use::Starting;
/// Where the run's task says its sandbox is ready (or why it is not), and where its events go.
type RunChannels = (oneshot::Sender<Result<(String, Isolation), ApiError>>, mpsc::Sender<RunEvent>);

async fn run(
    state: AppState,
    tenant: Tenant,
    plan: RunPlan,
    clock: RunClock,
    (ready, events): RunChannels,
    starting: Option<Starting>,
) {
    let expires_ms = now_ms().saturating_add(i64::try_from(plan.lifetime_s.saturating_mul(1000)).unwrap_or(i64::MAX));
    let metadata = Default::default();
    let ((id, isolation), zygote) = match start_sandbox_with_zygote(
        &state,
        &tenant,
        plan.spec.clone(),
        metadata,
        (expires_ms, Lifecycle::default()),
    )
    .await
    {
        Ok((record, zygote)) => ((record.id, record.isolation), zygote),
        Err(error) => {
            ready.send(Err(error.into())).ok();
            return;
        }
    };
    drop(starting);
    clock.allocated();
    clock.vm_booted(state.runtime().vm_boot(&id));
    // From here on the sandbox exists: whatever happens below, it is destroyed before this task ends.
    let outcome = tokio::select! {
        outcome = work(&state, (&id, isolation), zygote, plan, &clock, ready, &events) => outcome,
        () = events.closed() => {
            tracing::info!(sandbox = %id, "run: the client left; destroying the sandbox");
            None
        }
    };
    let outcome = outcome.map(|outcome| {
        outcome.map(|mut outcome| {
            (outcome.exit.phases, outcome.duration_ms) = clock.finish(state.metrics());
            outcome
        })
    });
    finish_run(&state, &id).await;
    if let Some(outcome) = outcome {
        events.send(RunEvent::Done(outcome)).await.ok();
    }
}

/// Writes the files, reports ready, then compiles and runs (through the zygote when there is one for the code's
/// language). `None` when there is nothing more to report.
async fn work(
    state: &AppState,
    (id, isolation): (&str, Isolation),
    zygote: Option<(ZygoteKind, String)>,
    plan: RunPlan,
    clock: &RunClock,
    ready: oneshot::Sender<Result<(String, Isolation), ApiError>>,
    events: &mpsc::Sender<RunEvent>,
) -> Option<Result<RunOutcome, ApiError>> {
    for (path, data) in plan.files {
        if let Err(error) = write_file(state, id, &path, data).await {
            ready.send(Err(error)).ok();
            return None;
        }
    }
    clock.files_ready();
    ready.send(Ok((id.to_owned(), isolation))).ok()?;
    // A pool member's spare code-context kernel: a run starts no context, and the program gets its memory and pids.
    if let Err(failure) = state.runtime().discard_prepared_contexts(id).await {
        tracing::warn!(sandbox = %id, reason = %failure.message, "could not discard a spare kernel");
    }
    let unused = match (zygote, plan.zygote_input) {
        (Some((kind, zygote)), Some((wanted, input))) if kind == wanted => {
            if let Some(outcome) = forked(state, id, &zygote, input, plan.spec.limits.timeout_ms, clock, events).await {
                return Some(outcome);
            }
            // It could not take the run (it may still be alive, e.g. its stdin refused the input).
            Some(zygote)
        }
        (Some((_, zygote)), _) => Some(zygote),
        (None, _) => None,
    };
    if let Some(zygote) = unused {
        // Not for this run: it must not hold the sandbox's memory and pids while the program runs.
        if let Err(failure) = state.runtime().signal_command(id, &zygote, SIGKILL).await {
            tracing::warn!(sandbox = %id, reason = %failure.message, "could not stop an unused zygote");
        }
    }
    let (timeout_ms, carried) =
        (plan.spec.limits.timeout_ms, state.output_budgets().stream_cap(plan.spec.limits.output_bytes));
    Some(execute(state, id, plan.compile, plan.command, (timeout_ms, carried), clock, events).await)
}

/// How long a zygote killed at its time limit may take to report its end.
const KILLED_GRACE: Duration = Duration::from_secs(10);

/// Hands `input` to the zygote `zygote` and follows the run it starts within `budget_ms`; `None` when the zygote
/// cannot take it (it is gone or its stdin closed), and then nothing was run.
async fn forked(
    state: &AppState,
    id: &str,
    zygote: &str,
    input: Vec<u8>,
    budget_ms: u64,
    clock: &RunClock,
    events: &mpsc::Sender<RunEvent>,
) -> Option<Result<RunOutcome, ApiError>> {
    let started = Instant::now();
    let runtime = state.runtime();
    let unusable = |failure: Failure| {
        tracing::warn!(sandbox = %id, command = %zygote, reason = %failure.message, "zygote unusable; running plainly");
    };
    let mut output = match runtime.stream_command(id, zygote, 0).await {
        Ok(output) => output,
        Err(failure) => {
            unusable(failure);
            return None;
        }
    };
    if let Err(failure) = runtime.command_stdin(id, zygote, input, true).await {
        unusable(failure);
        return None;
    }
    clock.program_started(clock.now_ms());
    state.metrics().zygote_run();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(budget_ms);
    let mut timed_out = false;
    let ended = loop {
        let limit = if timed_out { tokio::time::Instant::now() + KILLED_GRACE } else { deadline };
        match tokio::time::timeout_at(limit, output.recv()).await {
            Ok(Some(CommandEvent::Output { chunk, .. })) => {
                clock.output();
                // A closed channel means the client left; the select in `run` ends the run.
                events.send(RunEvent::Output(chunk)).await.ok();
            }
            Ok(Some(CommandEvent::Ended(status))) => break status.exit,
            Ok(None) => break None,
            Err(_) if timed_out => break None,
            Err(_) => {
                timed_out = true;
                if let Err(failure) = runtime.signal_command(id, zygote, SIGKILL).await {
                    tracing::warn!(sandbox = %id, reason = %failure.message, "could not kill a zygote at its time limit");
                }
            }
        }
    };
    let Some(mut exit) = ended else {
        if timed_out {
            // Killed, but its end was not reported: the sandbox is destroyed right after anyway.
            state.metrics().limit_kill(LimitKind::Time);
            let exit =
                CommandExit { exit_code: None, signal: Some(SIGKILL), timed_out: true, ..CommandExit::default() };
            return Some(Ok(RunOutcome::new(exit, false)));
        }
        let failure = Failure::new(FailureKind::SandboxGone, "the sandbox ended during the run");
        return Some(Err(runtime_error(state, id, failure).await));
    };
    if timed_out {
        exit.timed_out = true;
        state.metrics().limit_kill(LimitKind::Time);
    }
    state.metrics().exec_finished(started.elapsed().as_secs_f64());
    Some(Ok(RunOutcome::new(exit, false)))
}

async fn write_file(state: &AppState, id: &str, path: &str, data: Vec<u8>) -> Result<(), ApiError> {
    if let Some((parent, _)) = path.rsplit_once('/').filter(|(parent, _)| !parent.is_empty())
        && let Err(failure) = state.runtime().mkdir(id, parent, true).await
    {
        return Err(runtime_error(state, id, failure).await);
    }
    match state.runtime().write_file(id, path, data).await {
        Ok(()) => Ok(()),
        Err(failure) => Err(runtime_error(state, id, failure).await),
    }
}

/// Compiles (when there is a compile step), then runs, within one time budget.
async fn execute(
    state: &AppState,
    id: &str,
    compile: Option<CommandSpec>,
    mut command: CommandSpec,
    (budget_ms, output_limit): (u64, u64),
    clock: &RunClock,
    events: &mpsc::Sender<RunEvent>,
) -> Result<RunOutcome, ApiError> {
    let started = Instant::now();
    if let Some(mut compile) = compile {
        compile.timeout_ms = Some(budget_ms);
        let exit = exec(state, id, compile, output_limit, clock, events).await?;
        if exit.timed_out || exit.exit_code != Some(0) {
            let compile_failed = !exit.timed_out;
            return Ok(RunOutcome::new(exit, compile_failed));
        }
    }
    let spent = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    command.timeout_ms = Some(budget_ms.saturating_sub(spent).max(1));
    let sent_ms = clock.now_ms();
    let exit = exec(state, id, command, output_limit, clock, events).await?;
    mark_program(clock, sent_ms, &exit);
    state.metrics().exec_finished(started.elapsed().as_secs_f64());
    Ok(RunOutcome::new(exit, false))
}

/// Runs one command, forwarding its output as it arrives.
async fn exec(
    state: &AppState,
    id: &str,
    spec: CommandSpec,
    output_limit: u64,
    clock: &RunClock,
    events: &mpsc::Sender<RunEvent>,
) -> Result<CommandExit, ApiError> {
    let (chunks, mut received) = mpsc::channel(64);
    let forward = async {
        while let Some(chunk) = received.recv().await {
            clock.output();
            // A closed channel means the client left; the select in `run` ends the run.
            events.send(RunEvent::Output(chunk)).await.ok();
        }
    };
    let (result, ()) = tokio::join!(state.runtime().exec(id, spec, output_limit, chunks), forward);
    match result {
        Ok(exit) => {
            if exit.timed_out {
                state.metrics().limit_kill(LimitKind::Time);
            }
            Ok(exit)
        }
        Err(failure) => Err(runtime_error(state, id, failure).await),
    }
}
