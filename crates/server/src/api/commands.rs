//! Background commands: `POST …/exec` with `background: true` starts one (202 with its id; its start and end are
//! recorded in the store), and `/v1/sandboxes/{id}/commands` lists them, writes their stdin, resizes their
//! pseudo-terminal, signals and kills them.
//! Their output is streamed by `command_stream`.

use axum::Json;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use sandkasten_types::{CommandEvent, CommandExit, CommandSpec, CommandStatus, PtySize};

use crate::api::command_schemas::{BackgroundStarted, CommandBody, CommandList, SignalBody, StdinBody, signal_number};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{IdPath, JsonBody, running_sandbox, runtime_error, runtime_result};
use crate::auth::Tenant;
use crate::clock::{now_ms, rfc3339};
use crate::ids;
use crate::state::AppState;
use crate::store::{CommandRecord, SandboxRecord};
use sandkasten_types::LimitKind;

/// `{id}` and `{command_id}` path segments; segments that cannot be decoded are a 400.
#[derive(Debug)]
pub(crate) struct CommandPath(pub(crate) String, pub(crate) String);

impl<S: Send + Sync> FromRequestParts<S> for CommandPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path((id, command)) = Path::<(String, String)>::from_request_parts(parts, state).await?;
        Ok(CommandPath(id, command))
    }
}

/// The caller's running sandbox, given a well-formed command id (anything else cannot exist: 404).
pub(crate) async fn own_command(
    state: &AppState,
    tenant: &Tenant,
    id: &str,
    command: &str,
) -> Result<SandboxRecord, ApiError> {
    let sandbox = running_sandbox(state, tenant, id).await?;
    if !ids::is_command_id(command) {
        return Err(ApiError::not_found(format!("no command {command} in this sandbox")));
    }
    Ok(sandbox)
}

/// Records a started command, starts it in the background and answers 202; a task records its end.
pub(crate) async fn start(
    state: &AppState,
    tenant: &Tenant,
    id: &str,
    spec: CommandSpec,
    output_limit: u64,
) -> Result<Response, ApiError> {
    let (command_id, status) = start_background(state, tenant, id, spec, output_limit).await?;
    let body = BackgroundStarted { command_id, pid: status.pid, started_at: rfc3339(status.started_ms) };
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

/// Starts a background command, records its start and (in a task) its end: its id and status.
pub(crate) async fn start_background(
    state: &AppState,
    tenant: &Tenant,
    id: &str,
    spec: CommandSpec,
    output_limit: u64,
) -> Result<(String, CommandStatus), ApiError> {
    let command_id = record_start(state, tenant, id, &spec).await?;
    let retention = state.output_budgets().retention(tenant, id, output_limit);
    let status = match state.runtime().start_command(id, &command_id, spec, retention).await {
        Ok(status) => status,
        Err(failure) => {
            if let Err(error) = state.store().finish_command(&command_id, None, now_ms()).await {
                tracing::error!(command = %command_id, %error, "could not record the end of a command");
            }
            return Err(runtime_error(state, id, failure).await);
        }
    };
    state.metrics().command_started();
    tracing::info!(sandbox = %id, command = %command_id, pid = status.pid, "background command started");
    tokio::spawn(record_end(state.clone(), id.to_owned(), command_id.clone()));
    Ok((command_id, status))
}

/// Records that a command starts in sandbox `id` (the `commands` table), under a new id, which it answers.
pub(crate) async fn record_start(
    state: &AppState,
    tenant: &Tenant,
    id: &str,
    spec: &CommandSpec,
) -> Result<String, ApiError> {
    let command_id = ids::command_id()?;
    let argv = spec.resolved_argv().map_err(ApiError::unprocessable)?;
    let record = CommandRecord {
        id: command_id.clone(),
        sandbox_id: id.to_owned(),
        tenant: tenant.name.to_string(),
        argv,
        started_ms: now_ms(),
    };
    state.store().start_command(record).await?;
    Ok(command_id)
}

/// Waits for a background command's end (or its sandbox's) and records it.
async fn record_end(state: AppState, id: String, command_id: String) {
    let mut exit: Option<CommandExit> = None;
    if let Ok(mut events) = state.runtime().stream_command(&id, &command_id, u64::MAX).await {
        while let Some(event) = events.recv().await {
            if let CommandEvent::Ended(status) = event {
                exit = status.exit;
                break;
            }
        }
    }
    if exit.is_some_and(|e| e.timed_out) {
        state.metrics().limit_kill(LimitKind::Time);
    }
    state.metrics().command_ended();
    if let Err(error) = state.store().finish_command(&command_id, exit, now_ms()).await {
        tracing::error!(command = %command_id, %error, "could not record the end of a command");
    }
    tracing::info!(
        sandbox = %id, command = %command_id, exit_code = ?exit.and_then(|e| e.exit_code),
        signal = ?exit.and_then(|e| e.signal), "background command ended"
    );
}

/// List a sandbox's background commands.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/commands", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "Running and recently ended background commands", body = CommandList),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox for this tenant", body = ErrorBody),
        (status = 409, description = "The sandbox has ended", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn list(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
) -> Result<Json<CommandList>, ApiError> {
    let sandbox = running_sandbox(&state, &tenant, &id).await?;
    let isolation = sandbox.isolation;
    let commands = runtime_result(&state, &id, state.runtime().list_commands(&id).await).await?;
    Ok(Json(CommandList {
        commands: commands.into_iter().map(|status| CommandBody::new(status, isolation.clone())).collect(),
    }))
}

/// Write to a background command's stdin.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/commands/{command_id}/stdin", tag = "exec",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("command_id" = String, Path, description = "Command id"),
    ),
    request_body = StdinBody,
    responses(
        (status = 204, description = "Written (and closed with `eof`)"),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or command for this tenant", body = ErrorBody),
        (status = 409, description = "The sandbox or the command has ended, or its stdin is closed", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 422, description = "Unknown fields or wrong types", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn stdin(
    State(state): State<AppState>,
    tenant: Tenant,
    CommandPath(id, command): CommandPath,
    JsonBody(body): JsonBody<StdinBody>,
) -> Result<StatusCode, ApiError> {
    own_command(&state, &tenant, &id, &command).await?;
    runtime_result(&state, &id, state.runtime().command_stdin(&id, &command, body.data.into_bytes(), body.eof).await)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Send a signal to a background command's process group.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/commands/{command_id}/signal", tag = "exec",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("command_id" = String, Path, description = "Command id"),
    ),
    request_body = SignalBody,
    responses(
        (status = 204, description = "Sent"),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or command for this tenant", body = ErrorBody),
        (status = 409, description = "The sandbox or the command has ended", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 422, description = "Unknown signal", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn signal(
    State(state): State<AppState>,
    tenant: Tenant,
    CommandPath(id, command): CommandPath,
    JsonBody(body): JsonBody<SignalBody>,
) -> Result<StatusCode, ApiError> {
    own_command(&state, &tenant, &id, &command).await?;
    let signal = signal_number(&body.signal).map_err(ApiError::unprocessable)?;
    runtime_result(&state, &id, state.runtime().signal_command(&id, &command, signal).await).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Resize a background command's pseudo-terminal (started with `pty`); its foreground processes get SIGWINCH.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/commands/{command_id}/resize", tag = "exec",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("command_id" = String, Path, description = "Command id"),
    ),
    request_body = PtySize,
    responses(
        (status = 204, description = "Resized"),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or command for this tenant", body = ErrorBody),
        (status = 409, description = "The sandbox or the command has ended, or the command has no pseudo-terminal",
            body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 422, description = "cols or rows outside 1..=1000, unknown fields or wrong types", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn resize(
    State(state): State<AppState>,
    tenant: Tenant,
    CommandPath(id, command): CommandPath,
    JsonBody(size): JsonBody<PtySize>,
) -> Result<StatusCode, ApiError> {
    if let Some(reason) = size.invalid_reason() {
        return Err(ApiError::unprocessable(reason));
    }
    own_command(&state, &tenant, &id, &command).await?;
    runtime_result(&state, &id, state.runtime().resize_command(&id, &command, size).await).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Kill a background command (SIGKILL to its process group; it stays listed with its exit).
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}/commands/{command_id}", tag = "exec",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("command_id" = String, Path, description = "Command id"),
    ),
    responses(
        (status = 204, description = "Killed (or had ended already)"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or command for this tenant", body = ErrorBody),
        (status = 409, description = "The sandbox has ended", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn kill(
    State(state): State<AppState>,
    tenant: Tenant,
    CommandPath(id, command): CommandPath,
) -> Result<StatusCode, ApiError> {
    own_command(&state, &tenant, &id, &command).await?;
    runtime_result(&state, &id, state.runtime().signal_command(&id, &command, 9).await).await?;
    Ok(StatusCode::NO_CONTENT)
}
