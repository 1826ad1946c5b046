//! The work of one `POST /v1/run`, in its own task so that the request going away cannot skip the cleanup: create the
//! sandbox, write the files, compile (C), run, and destroy the sandbox on every path. A client that leaves (its
//! receiver dropped) ends the run early; the sandbox is destroyed before the result is sent.

use std::time::Instant;

use sandkasten_types::{CommandExit, CommandSpec};
use tokio::sync::{mpsc, oneshot};

use crate::api::destroy_quietly;
use crate::api::error::ApiError;
use crate::api::extract::runtime_error;
use crate::api::run::request::RunPlan;
use crate::api::run::response::RunError;
use crate::api::sandboxes::start_sandbox;
use crate::auth::Tenant;
use crate::clock::now_ms;
use crate::metrics::{ExitReason, LimitKind};
use crate::runtime::OutputChunk;
use crate::state::AppState;
use crate::store::SandboxState;

/// How a run ended, when it got to run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunOutcome {
    /// How the command (or the failed compile) ended.
    pub(crate) exit: CommandExit,
    /// Compile error.
    pub(crate) compile_failed: bool,
    /// Compile and run, in milliseconds.
    pub(crate) duration_ms: f64,
}

impl RunOutcome {
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
    pub(crate) ready: oneshot::Receiver<Result<String, ApiError>>,
    pub(crate) events: mpsc::Receiver<RunEvent>,
}

/// Starts a run in its own task.
pub(crate) fn spawn(state: AppState, tenant: Tenant, plan: RunPlan) -> Started {
    let (ready_sender, ready) = oneshot::channel();
    let (event_sender, events) = mpsc::channel(64);
    tokio::spawn(run(state, tenant, plan, ready_sender, event_sender));
    Started { ready, events }
}

async fn run(
    state: AppState,
    tenant: Tenant,
    plan: RunPlan,
    ready: oneshot::Sender<Result<String, ApiError>>,
    events: mpsc::Sender<RunEvent>,
) {
    let expires_ms = now_ms().saturating_add(i64::try_from(plan.lifetime_s.saturating_mul(1000)).unwrap_or(i64::MAX));
    let metadata = Default::default();
    let id = match start_sandbox(&state, &tenant, plan.spec.clone(), metadata, expires_ms).await {
        Ok(record) => record.id,
        Err(error) => {
            ready.send(Err(error)).ok();
            return;
        }
    };
    // From here on the sandbox exists: whatever happens below, it is destroyed before this task ends.
    let outcome = tokio::select! {
        outcome = work(&state, &id, plan, ready, &events) => outcome,
        () = events.closed() => {
            tracing::info!(sandbox = %id, "run: the client left; destroying the sandbox");
            None
        }
    };
    finish(&state, &id).await;
    if let Some(outcome) = outcome {
        events.send(RunEvent::Done(outcome)).await.ok();
    }
}

/// Destroys the run's sandbox and records its end. A sandbox the runtime cannot destroy stays running in the store,
/// and the expiry sweeper retries when its lifetime is over.
async fn finish(state: &AppState, id: &str) {
    if !destroy_quietly(state, id).await {
        return;
    }
    match state.store().end_sandbox(id, SandboxState::Destroyed, "run finished", now_ms()).await {
        Ok(ended) => {
            if ended {
                state.metrics().sandbox_exited(ExitReason::RunFinished);
            }
            tracing::info!(sandbox = %id, "run finished; sandbox destroyed");
        }
        Err(error) => tracing::error!(sandbox = %id, %error, "could not record the end of a run's sandbox"),
    }
}

/// Writes the files, reports ready, then compiles and runs. `None` when there is nothing more to report.
async fn work(
    state: &AppState,
    id: &str,
    plan: RunPlan,
    ready: oneshot::Sender<Result<String, ApiError>>,
    events: &mpsc::Sender<RunEvent>,
) -> Option<Result<RunOutcome, ApiError>> {
    for (path, data) in plan.files {
        if let Err(error) = write_file(state, id, &path, data).await {
            ready.send(Err(error)).ok();
            return None;
        }
    }
    ready.send(Ok(id.to_owned())).ok()?;
    Some(execute(state, id, plan.compile, plan.command, plan.spec.limits.timeout_ms, events).await)
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
    budget_ms: u64,
    events: &mpsc::Sender<RunEvent>,
) -> Result<RunOutcome, ApiError> {
    let started = Instant::now();
    let elapsed_ms = || started.elapsed().as_secs_f64() * 1000.0;
    if let Some(mut compile) = compile {
        compile.timeout_ms = Some(budget_ms);
        let exit = exec(state, id, compile, events).await?;
        if exit.timed_out || exit.exit_code != Some(0) {
            let compile_failed = !exit.timed_out;
            return Ok(RunOutcome { exit, compile_failed, duration_ms: elapsed_ms() });
        }
    }
    let spent = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    command.timeout_ms = Some(budget_ms.saturating_sub(spent).max(1));
    let exit = exec(state, id, command, events).await?;
    state.metrics().exec_finished(started.elapsed().as_secs_f64());
    Ok(RunOutcome { exit, compile_failed: false, duration_ms: elapsed_ms() })
}

/// Runs one command, forwarding its output as it arrives.
async fn exec(
    state: &AppState,
    id: &str,
    spec: CommandSpec,
    events: &mpsc::Sender<RunEvent>,
) -> Result<CommandExit, ApiError> {
    let (chunks, mut received) = mpsc::channel(64);
    let forward = async {
        while let Some(chunk) = received.recv().await {
            // A closed channel means the client left; the select in `run` ends the run.
            events.send(RunEvent::Output(chunk)).await.ok();
        }
    };
    let (result, ()) = tokio::join!(state.runtime().exec(id, spec, chunks), forward);
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
