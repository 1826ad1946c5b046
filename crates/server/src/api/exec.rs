//! `POST /v1/sandboxes/{id}/exec`: run a command to its end and answer its result as JSON, or, with
//! `Accept: text/event-stream`, stream `stdout`/`stderr` events as the output arrives and end with an `exit` event;
//! with `background: true`, start it and answer 202 with its id at once (`commands`).
//!
//! The command runs in its own task: a client that disconnects does not stop it, and its end is always recorded.

use std::convert::Infallible;
use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use sandkasten_types::{CommandExit, CommandSpec, OutputChunk, PtySize, StreamKind};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

use crate::api::command_schemas::BackgroundStarted;
use crate::api::commands;
use crate::api::error::{ApiError, ErrorBody, ErrorDetail};
use crate::api::extract::{IdPath, JsonBody, running_sandbox, runtime_error};
use crate::api::output::{self, Capture, json_event};
use crate::api::running::{Started, pump};
use crate::api::scan;
use crate::api::schemas::{ExecBody, ExecResponse, ExitEvent};
use crate::auth::Tenant;
use crate::clock::now_ms;
use crate::metrics::ExecPhase;
use crate::state::AppState;
use crate::store::SandboxRecord;
use crate::validate;
use sandkasten_scan::ScanLanguage;
use sandkasten_types::Isolation;
use sandkasten_types::LimitKind;

/// Checks the request against the sandbox and builds the command for the runtime (timeout always set).
fn command_spec(body: ExecBody, sandbox: &SandboxRecord) -> Result<CommandSpec, ApiError> {
    let max_timeout = sandbox.spec.limits.timeout_ms;
    let timeout_ms = body.timeout_ms.unwrap_or(max_timeout);
    if !(1..=max_timeout).contains(&timeout_ms) {
        return Err(ApiError::unprocessable(format!(
            "timeout_ms must be between 1 and the sandbox's limits.timeout_ms ({max_timeout}), got {timeout_ms}"
        )));
    }
    if let Some(cwd) = &body.cwd {
        validate::sandbox_path("cwd", cwd).map_err(ApiError::bad_request)?;
    }
    validate::environment(&body.env).map_err(ApiError::unprocessable)?;
    if let Some(reason) = body.pty.as_ref().and_then(PtySize::invalid_reason) {
        return Err(ApiError::unprocessable(reason));
    }
    let spec = CommandSpec {
        argv: body.argv,
        cmd: body.cmd,
        env: body.env,
        cwd: body.cwd,
        stdin: body.stdin,
        timeout_ms: Some(timeout_ms),
        pty: body.pty,
        ..CommandSpec::default()
    };
    let argv = spec.resolved_argv().map_err(ApiError::unprocessable)?;
    validate::argv(&argv).map_err(ApiError::unprocessable)?;
    Ok(spec)
}

/// Records the command, then runs it in a task that records its end whatever happens to the request.
async fn start(
    state: &AppState,
    tenant: &Tenant,
    id: &str,
    spec: CommandSpec,
    output_limit: u64,
) -> Result<Started<CommandExit>, ApiError> {
    let command_id = commands::record_start(state, tenant, id, &spec).await?;
    let (events, chunks) = mpsc::channel(64);
    let (finished, done) = oneshot::channel();
    let (state, id) = (state.clone(), id.to_owned());
    let started = Instant::now();
    tokio::spawn(async move {
        // The output passes through here on its way to the request, so the first chunk is timed even when the
        // client has left (then the chunks are dropped and the command is not held up).
        let (runtime_events, mut received) = mpsc::channel::<OutputChunk>(64);
        let forward = async {
            let mut first = true;
            while let Some(chunk) = received.recv().await {
                if first {
                    first = false;
                    state.metrics().exec_phase(ExecPhase::FirstOutput, started.elapsed().as_secs_f64());
                }
                events.send(chunk).await.ok();
            }
        };
        let (result, ()) = tokio::join!(state.runtime().exec(&id, spec, output_limit, runtime_events), forward);
        let seconds = started.elapsed().as_secs_f64();
        state.metrics().exec_finished(seconds);
        state.metrics().exec_phase(ExecPhase::Total, seconds);
        if result.as_ref().is_ok_and(|exit| exit.timed_out) {
            state.metrics().limit_kill(LimitKind::Time);
        }
        if let Err(error) = state.store().finish_command(&command_id, result.as_ref().ok().copied(), now_ms()).await {
            tracing::error!(command = %command_id, %error, "could not record the end of a command");
        }
        match &result {
            Ok(exit) => tracing::info!(
                sandbox = %id, command = %command_id, exit_code = ?exit.exit_code, signal = ?exit.signal,
                timed_out = exit.timed_out, seconds, "command ended"
            ),
            Err(failure) => tracing::warn!(
                sandbox = %id, command = %command_id, kind = ?failure.kind, reason = %failure.message, "command failed"
            ),
        }
        // The request may be gone; then nobody wants the result.
        finished.send(result).ok();
    });
    Ok(Started { chunks, done, started })
}

/// Run a command in a sandbox.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/exec", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = ExecBody,
    responses(
        (status = 200, description = "The command's result; with `Accept: text/event-stream` a stream of `stdout` and \
            `stderr` events (data: OutputEvent), then one `exit` event (data: ExitEvent), or an `error` event \
            (data: ErrorDetail) when the runtime fails", content(
            (ExecResponse = "application/json"),
            (String = "text/event-stream"),
        )),
        (status = 202, description = "With `background: true`: started; follow it under \
            `/v1/sandboxes/{id}/commands/{command_id}`", body = BackgroundStarted),
        (status = 400, description = "Malformed JSON or cwd", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox for this tenant", body = ErrorBody),
        (status = 409, description = "The sandbox has ended, or (background) it runs too many background commands",
            body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 422, description = "No command, both argv and cmd, bad env, timeout_ms or pty size, a `scan_policy` that \
            would loosen the tenant's (`unprocessable`), or a command line the static scan refused under an \
            `enforce` policy (`scan_refused`, with `findings`; nothing was started)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn exec(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
    headers: HeaderMap,
    JsonBody(body): JsonBody<ExecBody>,
) -> Result<Response, ApiError> {
    let sandbox = running_sandbox(&state, &tenant, &id).await?;
    let background = body.background;
    let scan_policy = body.scan_policy.clone();
    let spec = command_spec(body, &sandbox)?;
    let findings = scanned(&tenant, scan_policy.as_ref(), &spec).await?;
    let limit = sandbox.spec.limits.output_bytes;
    let isolation = sandbox.isolation.clone();
    if background {
        return commands::start(&state, &tenant, &id, spec, limit).await;
    }
    // Past this the agent stops reading a stream (a slow client cannot make the server queue more of it either).
    let carried = state.output_budgets().stream_cap(limit);
    if output::wants_stream(&headers) {
        let started = start(&state, &tenant, &id, spec, carried).await?;
        return Ok(stream(state, id, isolation, started, limit));
    }
    let mut response = finish(&state, &tenant, &sandbox, spec).await?;
    response.findings = findings;
    Ok(Json(response).into_response())
}

/// What the static scan says of a command: its command line as bash (argv joined), under the tenant's policy
/// tightened by the request's; refused (in `enforce`) before the command is recorded or started.
async fn scanned(
    tenant: &Tenant,
    policy: Option<&sandkasten_scan::ScanPolicyOverride>,
    spec: &CommandSpec,
) -> Result<Vec<sandkasten_scan::Finding>, ApiError> {
    let line =
        spec.cmd.clone().or_else(|| spec.argv.as_deref().map(sandkasten_scan::argv_command_line)).unwrap_or_default();
    scan::gate(tenant, policy, ScanLanguage::Bash, &line).await
}

/// Runs a command in the caller's running sandbox `id` to its end and answers its result: what `exec` answers as
/// JSON, and what the MCP `exec` tool reports. `background` must be false.
pub(crate) async fn run_to_end(
    state: &AppState,
    tenant: &Tenant,
    id: &str,
    body: ExecBody,
) -> Result<ExecResponse, ApiError> {
    let sandbox = running_sandbox(state, tenant, id).await?;
    if body.background {
        return Err(ApiError::unprocessable("a background command has no result to wait for"));
    }
    let scan_policy = body.scan_policy.clone();
    let spec = command_spec(body, &sandbox)?;
    let findings = scanned(tenant, scan_policy.as_ref(), &spec).await?;
    let mut response = finish(state, tenant, &sandbox, spec).await?;
    response.findings = findings;
    Ok(response)
}

/// Starts `spec` in `sandbox` and keeps its output (within the sandbox's limit) until it ends.
async fn finish(
    state: &AppState,
    tenant: &Tenant,
    sandbox: &SandboxRecord,
    spec: CommandSpec,
) -> Result<ExecResponse, ApiError> {
    let id = sandbox.id.as_str();
    let limit = sandbox.spec.limits.output_bytes;
    let carried = state.output_budgets().stream_cap(limit);
    let budgets = state.output_budgets();
    let [mut stdout, mut stderr] = [budgets.hold(tenant, id), budgets.hold(tenant, id)].map(Capture::charged);
    let started = start(state, tenant, id, spec, carried).await?;
    let started_at = started.started;
    let result = pump(started, |chunk| {
        match chunk.stream {
            StreamKind::Stdout => stdout.keep(&chunk.data, limit),
            StreamKind::Stderr => stderr.keep(&chunk.data, limit),
        }
        std::future::ready(())
    })
    .await;
    let exit = match result {
        Ok(exit) => exit,
        Err(failure) => return Err(runtime_error(state, id, failure).await),
    };
    let duration_ms = started_at.elapsed().as_secs_f64() * 1000.0;
    Ok(ExecResponse::new(id.to_owned(), sandbox.isolation.clone(), exit, stdout, stderr, duration_ms))
}

/// The SSE response: a task forwards events while the command runs; a gone client does not stop the command.
fn stream(state: AppState, id: String, isolation: Isolation, started: Started<CommandExit>, limit: u64) -> Response {
    let (sender, receiver) = mpsc::channel::<Result<Event, Infallible>>(64);
    tokio::spawn(async move {
        let started_at = started.started;
        let (mut stdout, mut stderr) = (Capture::default(), Capture::default());
        let result = pump(started, |chunk| {
            let (name, capture) = match chunk.stream {
                StreamKind::Stdout => ("stdout", &mut stdout),
                StreamKind::Stderr => ("stderr", &mut stderr),
            };
            let event = capture.forward(&chunk.data, limit).map(|data| json_event(name, &data));
            let sender = sender.clone();
            async move {
                if let Some(event) = event {
                    // A closed channel means the client left: keep draining so the command is not blocked.
                    sender.send(Ok(event)).await.ok();
                }
            }
        })
        .await;
        for (name, capture) in [("stdout", &mut stdout), ("stderr", &mut stderr)] {
            if let Some(data) = capture.flush() {
                sender.send(Ok(json_event(name, &data))).await.ok();
            }
        }
        let last = match result {
            Ok(exit) => {
                let truncated = [stdout.truncated(), stderr.truncated()];
                let duration_ms = started_at.elapsed().as_secs_f64() * 1000.0;
                json_event("exit", &ExitEvent::new(isolation, exit, truncated, duration_ms))
            }
            Err(failure) => {
                let error = runtime_error(&state, &id, failure).await;
                state.metrics().error(error.code.as_str());
                json_event("error", &ErrorDetail::from(error))
            }
        };
        sender.send(Ok(last)).await.ok();
    });
    Sse::new(ReceiverStream::new(receiver)).keep_alive(KeepAlive::default()).into_response()
}
