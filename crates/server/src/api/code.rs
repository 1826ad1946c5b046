//! `POST /v1/sandboxes/{id}/code`: run one cell in a stateful code context and answer its result as JSON, or, with
//! `Accept: text/event-stream`, stream `stdout`/`stderr` events as the output arrives, then one `result` event per
//! rich result, an `error` event when the cell raised, and a final `end` event with the whole response (a runtime
//! failure ends the stream with a `failure` event instead).
//!
//! The cell runs in its own task: a client that disconnects does not cut a cell in half (which would leave its
//! context out of step).

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use sandkasten_runtime::CellInterrupt;
use sandkasten_types::{CellOutcome, CodeLanguage, CodeRun};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

use crate::api::code_schemas::{CodeBody, CodeResponse};
use crate::api::contexts::is_context_id;
use crate::api::error::{ApiError, ErrorBody, ErrorDetail};
use crate::api::extract::{IdPath, JsonBody, running_sandbox, runtime_error, runtime_result};
use crate::api::output::{self, json_event};
use crate::api::running::{Started, pump};
use crate::api::scan;
use crate::auth::Tenant;
use crate::state::AppState;
use crate::store::SandboxRecord;
use sandkasten_scan::{Finding, ScanLanguage, ScanPolicyOverride};
use sandkasten_types::Isolation;
use sandkasten_types::LimitKind;

/// Checks the request against the sandbox and builds the runtime's request (timeout always set).
fn code_run(body: CodeBody, sandbox: &SandboxRecord) -> Result<CodeRun, ApiError> {
    if body.language.is_none() && body.context_id.is_none() {
        return Err(ApiError::unprocessable("give the language (python, javascript or bash), or a context_id"));
    }
    if let Some(context) = &body.context_id
        && !is_context_id(context)
    {
        return Err(ApiError::not_found(format!("no code context {context} in this sandbox")));
    }
    crate::validate::environment(&body.env).map_err(ApiError::unprocessable)?;
    let max_timeout = sandbox.spec.limits.timeout_ms;
    let timeout_ms = body.timeout_ms.unwrap_or(max_timeout);
    if !(1..=max_timeout).contains(&timeout_ms) {
        return Err(ApiError::unprocessable(format!(
            "timeout_ms must be between 1 and the sandbox's limits.timeout_ms ({max_timeout}), got {timeout_ms}"
        )));
    }
    Ok(CodeRun {
        language: body.language.map(Into::into),
        code: body.code,
        context_id: body.context_id,
        timeout_ms,
        max_output_bytes: sandbox.spec.limits.output_bytes,
        env: body.env,
    })
}

/// Starts a cell in its own task (a client that leaves does not cut it in half, unless the caller passes an
/// `interrupt` it fires then).
pub(crate) fn start(
    state: &AppState,
    id: &str,
    request: CodeRun,
    interrupt: Option<CellInterrupt>,
) -> Started<CellOutcome> {
    let (events, chunks) = mpsc::channel(64);
    let (finished, done) = oneshot::channel();
    let (state, id) = (state.clone(), id.to_owned());
    let started = Instant::now();
    tokio::spawn(async move {
        let timeout = Duration::from_millis(request.timeout_ms);
        let result = state.runtime().run_code(&id, request, events, interrupt).await;
        if let Ok(outcome) = &result
            && stopped_at_timeout(outcome, started.elapsed(), timeout)
        {
            state.metrics().limit_kill(LimitKind::Time);
        }
        match &result {
            Ok(outcome) => tracing::info!(
                sandbox = %id, context = %outcome.context_id, execution_count = outcome.execution_count,
                error = outcome.error.as_ref().map(|e| e.name.as_str()), seconds = started.elapsed().as_secs_f64(),
                "cell ended"
            ),
            Err(failure) => {
                tracing::warn!(sandbox = %id, kind = ?failure.kind, reason = %failure.message, "cell failed");
            }
        }
        finished.send(result).ok();
    });
    Started { chunks, done, started }
}

/// Whether a cell was stopped by its timeout: it ran at least that long and was interrupted (Python's
/// `KeyboardInterrupt`, JavaScript's `TimeoutError`) or its context had to be restarted. A cell that raises one of
/// those itself before its timeout does not count.
fn stopped_at_timeout(outcome: &CellOutcome, elapsed: Duration, timeout: Duration) -> bool {
    let interrupted =
        outcome.error.as_ref().is_some_and(|e| matches!(e.name.as_str(), "KeyboardInterrupt" | "TimeoutError"));
    elapsed >= timeout && (interrupted || outcome.context_restarted)
}

/// Run code in a stateful context.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/code", tag = "code",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = CodeBody,
    responses(
        (status = 200, description = "The cell's result (a cell that raised is still a 200: see `error`); with \
            `Accept: text/event-stream` a stream of `stdout` and `stderr` events (data: OutputEvent), one `result` \
            event per rich result (data: CellResultBody), an `error` event if the cell raised (data: CellErrorBody), \
            then one `end` event (data: CodeResponse), or a `failure` event (data: ErrorDetail) when the runtime \
            fails", content(
            (CodeResponse = "application/json"),
            (String = "text/event-stream"),
        )),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or context for this tenant", body = ErrorBody),
        (status = 409, description = "The sandbox has ended", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 422, description = "No language, a language other than the context's, bad timeout_ms, too many \
            contexts, the interpreter cannot start, a `scan_policy` that would loosen the tenant's \
            (`unprocessable`), or a cell the static scan refused under an `enforce` policy (`scan_refused`, with \
            `findings`; the cell did not run)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn run_code(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
    headers: HeaderMap,
    JsonBody(body): JsonBody<CodeBody>,
) -> Result<Response, ApiError> {
    if !output::wants_stream(&headers) {
        return Ok(Json(run_cell(&state, &tenant, &id, body).await?).into_response());
    }
    let sandbox = running_sandbox(&state, &tenant, &id).await?;
    let scan_policy = body.scan_policy.clone();
    let request = code_run(body, &sandbox)?;
    let findings = scanned(&state, &tenant, &id, scan_policy.as_ref(), &request).await?;
    let started = start(&state, &id, request, None);
    Ok(stream(state, id, sandbox.isolation.clone(), started, findings))
}

/// Runs one cell in the caller's running sandbox `id` (after the static scan, under the tenant's policy tightened
/// by the request's) and answers its result: what `run_code` answers as JSON, and what the MCP `run_code` tool
/// reports.
pub(crate) async fn run_cell(
    state: &AppState,
    tenant: &Tenant,
    id: &str,
    body: CodeBody,
) -> Result<CodeResponse, ApiError> {
    let sandbox = running_sandbox(state, tenant, id).await?;
    let scan_policy = body.scan_policy.clone();
    let request = code_run(body, &sandbox)?;
    let findings = scanned(state, tenant, id, scan_policy.as_ref(), &request).await?;
    let started = start(state, id, request, None);
    let started_at = started.started;
    let outcome = match pump(started, |_| std::future::ready(())).await {
        Ok(outcome) => outcome,
        Err(failure) => return Err(runtime_error(state, id, failure).await),
    };
    let duration_ms = started_at.elapsed().as_secs_f64() * 1000.0;
    let mut response = CodeResponse::new(id.to_owned(), sandbox.isolation.clone(), outcome, duration_ms);
    response.findings = findings;
    Ok(response)
}

/// What the static scan says of a cell (in its language; none when the language is unknown: the run answers 404).
pub(crate) async fn scanned(
    state: &AppState,
    tenant: &Tenant,
    id: &str,
    policy: Option<&ScanPolicyOverride>,
    request: &CodeRun,
) -> Result<Vec<Finding>, ApiError> {
    let Some(language) = cell_language(state, id, request).await? else {
        return Ok(Vec::new());
    };
    match scan_language(language) {
        Some(grammar) => scan::gate(tenant, policy, grammar, &request.code).await,
        None => scan::gate_unreadable(tenant, policy, language.as_str()),
    }
}

/// The grammar a cell of `language` is scanned with; `None`: the scan cannot read it (Java, R).
fn scan_language(language: CodeLanguage) -> Option<ScanLanguage> {
    match language {
        CodeLanguage::Python => Some(ScanLanguage::Python),
        // TypeScript is read with the JavaScript grammar: its type annotations are parse errors around the calls.
        CodeLanguage::Javascript | CodeLanguage::Typescript => Some(ScanLanguage::Javascript),
        CodeLanguage::Bash => Some(ScanLanguage::Bash),
        CodeLanguage::Java | CodeLanguage::R => None,
    }
}

/// A cell's language: the request's, else its context's (`None` for an unknown context, which the run answers 404).
async fn cell_language(state: &AppState, id: &str, request: &CodeRun) -> Result<Option<CodeLanguage>, ApiError> {
    let language = match (request.language, &request.context_id) {
        (Some(language), _) => Some(language),
        (None, Some(context)) => {
            let contexts = runtime_result(state, id, state.runtime().list_contexts(id).await).await?;
            contexts.into_iter().find(|c| &c.id == context).map(|c| c.language)
        }
        (None, None) => None,
    };
    Ok(language)
}

/// The SSE response: a task forwards events while the cell runs.
fn stream(
    state: AppState,
    id: String,
    isolation: Isolation,
    started: Started<CellOutcome>,
    findings: Vec<Finding>,
) -> Response {
    let (sender, receiver) = mpsc::channel::<Result<Event, Infallible>>(64);
    tokio::spawn(async move {
        let started_at = started.started;
        let result = pump(started, |chunk| {
            let name = chunk.stream.as_str();
            let data = output::event(&chunk.data);
            let sender = sender.clone();
            // A closed channel means the client left: the cell goes on regardless.
            async move {
                if let Some(data) = data {
                    sender.send(Ok(json_event(name, &data))).await.ok();
                }
            }
        })
        .await;
        match result {
            Ok(outcome) => {
                let duration_ms = started_at.elapsed().as_secs_f64() * 1000.0;
                let mut response = CodeResponse::new(id, isolation, outcome, duration_ms);
                response.findings = findings;
                for result in &response.results {
                    sender.send(Ok(json_event("result", result))).await.ok();
                }
                if let Some(error) = &response.error {
                    sender.send(Ok(json_event("error", error))).await.ok();
                }
                sender.send(Ok(json_event("end", &response))).await.ok();
            }
            Err(failure) => {
                let error = runtime_error(&state, &id, failure).await;
                state.metrics().error(error.code.as_str());
                let detail = ErrorDetail::from(error);
                sender.send(Ok(json_event("failure", &detail))).await.ok();
            }
        }
    });
    Sse::new(ReceiverStream::new(receiver)).keep_alive(KeepAlive::default()).into_response()
}
