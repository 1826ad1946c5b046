//! `POST /v1/run`: the one-shot path as one call. A sandbox is created (it counts against the tenant's quota while it
//! lives), the files and the code are written, the code is compiled (C) and run, and the sandbox is destroyed on
//! every path, a client that disconnects included. The answer is the result as JSON, or with
//! `Accept: text/event-stream` `stdout`/`stderr` events as the output arrives and a final `exit` (or `error`) event.

mod phases;
mod request;
mod response;
mod task;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use sandkasten_types::StreamKind;
use tokio::sync::mpsc;

use crate::api::error::{ApiError, ErrorBody, ErrorDetail};
use crate::api::extract::JsonBody;
use crate::api::output::{self, Capture, json_event};
use crate::api::scan;
use crate::auth::Tenant;
use crate::lifecycle::resolve_isolation;
use crate::state::AppState;
use sandkasten_scan::Finding;
use sandkasten_types::Isolation;

use request::RunRequest;
pub(crate) use response::RunExitEvent;
use response::RunResponse;

use super::schemas::{ExecResponse, with_output_limit};
use task::{RunEvent, RunOutcome};

/// Run code or a command once in a fresh sandbox, then destroy it.
#[utoipa::path(
    post, path = "/v1/run", tag = "exec",
    request_body = RunRequest,
    responses(
        (status = 200, description = "The run's result (`error.code = compile_error` when C did not compile); with \
            `Accept: text/event-stream` a stream of `stdout` and `stderr` events (data: OutputEvent), then one `exit` \
            event (data: RunExitEvent), or an `error` event (data: ErrorDetail) when the runtime fails", content(
            (RunResponse = "application/json"),
            (String = "text/event-stream"),
        )),
        (status = 400, description = "Malformed JSON or a bad file path", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 413, description = "Body or a file too large", body = ErrorBody),
        (status = 422, description = "Nothing (or too much) to run, unknown language or isolation, bad env, limits \
            or files, a `scan_policy` that would loosen the tenant's (`unprocessable`), an isolation tier that \
            cannot run here (`tier_unavailable`), or code the static scan refused under an `enforce` policy \
            (`scan_refused`, with `findings`; no sandbox was created)",
            body = ErrorBody),
        (status = 429, description = "A tenant quota would be exceeded", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn run(
    State(state): State<AppState>,
    tenant: Tenant,
    headers: HeaderMap,
    JsonBody(body): JsonBody<RunRequest>,
) -> Result<Response, ApiError> {
    let requested = Instant::now();
    let (scan_input, scan_policy) = (body.scan_input(), body.scan_policy.clone());
    let template = body.template.clone();
    let mut plan = request::plan(body, state.settings())?;
    state.shared_templates().fetch(state.effective_config(), template.as_deref()).await?;
    // A template removal waits while the template is chosen, then keeps the layers chosen until the run's sandbox
    // is started (`template_use`): the run's task holds them, so a client that goes away does not release them early.
    let choosing = state.choosing_template(template.as_deref()).await;
    crate::built_templates::choose(&state.effective_config().templates, template.as_deref())?.apply(&mut plan.spec);
    let starting = choosing.map(|choosing| choosing.starting(&plan.spec.layers.layers));
    // Resolved here as `start_sandbox` will (which gives the answer its isolation), so that a tier that cannot run
    // is refused before the scan.
    resolve_isolation(&state, &tenant, plan.spec.isolation, &plan.spec.workload)?;
    // The scan refuses before the run's sandbox exists (nothing is created, nothing counts against the quota).
    let findings = match &scan_input {
        Some((language, code)) => scan::gate(&tenant, scan_policy.as_ref(), *language, code).await?,
        None => Vec::new(),
    };
    let limit = plan.spec.limits.output_bytes;
    let started = task::spawn(state.clone(), tenant.clone(), plan, requested, starting);
    let (id, tier) =
        started.ready.await.map_err(|_| ApiError::internal("the run's task ended before its sandbox was ready"))??;
    if output::wants_stream(&headers) {
        return Ok(stream(state, id, tier, started.events, limit, findings));
    }
    let budgets = state.output_budgets();
    let captures = [budgets.hold(&tenant, &id), budgets.hold(&tenant, &id)].map(Capture::charged);
    collect(id, tier, started.events, limit, captures, findings).await
}

fn result(
    id: String,
    isolation: Isolation,
    outcome: RunOutcome,
    [stdout, stderr]: [Capture; 2],
    findings: Vec<Finding>,
) -> RunResponse {
    let error = outcome.error();
    let mut result = ExecResponse::new(id, isolation, outcome.exit, stdout, stderr, outcome.duration_ms);
    result.findings = findings;
    RunResponse { result, error }
}

/// The JSON answer: output kept up to the limit, then the result.
async fn collect(
    id: String,
    isolation: Isolation,
    mut events: mpsc::Receiver<RunEvent>,
    limit: u64,
    [mut stdout, mut stderr]: [Capture; 2],
    findings: Vec<Finding>,
) -> Result<Response, ApiError> {
    while let Some(event) = events.recv().await {
        match event {
            RunEvent::Output(chunk) => match chunk.stream {
                StreamKind::Stdout => stdout.keep(&chunk.data, limit),
                StreamKind::Stderr => stderr.keep(&chunk.data, limit),
            },
            RunEvent::Done(outcome) => {
                return Ok(Json(result(id, isolation, outcome?, [stdout, stderr], findings)).into_response());
            }
        }
    }
    Err(ApiError::internal("the run's task ended without a result"))
}

/// What the event stream still has to send.
struct StreamState {
    state: AppState,
    id: String,
    isolation: Isolation,
    events: mpsc::Receiver<RunEvent>,
    limit: u64,
    stdout: Capture,
    stderr: Capture,
    pending: VecDeque<Event>,
    done: bool,
    /// The scan's findings (mode `warn`), sent with the `exit` event.
    findings: Vec<Finding>,
}

impl StreamState {
    /// Turns one run event into zero or more SSE events.
    fn absorb(&mut self, event: Option<RunEvent>) {
        let outcome = match event {
            Some(RunEvent::Output(chunk)) => {
                let (name, capture) = match chunk.stream {
                    StreamKind::Stdout => ("stdout", &mut self.stdout),
                    StreamKind::Stderr => ("stderr", &mut self.stderr),
                };
                if let Some(data) = capture.forward(&chunk.data, self.limit) {
                    self.pending.push_back(json_event(name, &data));
                }
                return;
            }
            Some(RunEvent::Done(outcome)) => outcome,
            None => Err(ApiError::internal("the run's task ended without a result")),
        };
        self.done = true;
        for (name, capture) in [("stdout", &mut self.stdout), ("stderr", &mut self.stderr)] {
            if let Some(data) = capture.flush() {
                self.pending.push_back(json_event(name, &data));
            }
        }
        let last = match outcome {
            Ok(outcome) => json_event(
                "exit",
                &RunExitEvent {
                    sandbox_id: self.id.clone(),
                    isolation: self.isolation.clone(),
                    exit: with_output_limit(outcome.exit, self.stdout.truncated() || self.stderr.truncated()),
                    stdout_truncated: self.stdout.truncated(),
                    stderr_truncated: self.stderr.truncated(),
                    duration_ms: outcome.duration_ms,
                    error: outcome.error(),
                    findings: std::mem::take(&mut self.findings),
                },
            ),
            Err(error) => {
                self.state.metrics().error(error.code.as_str());
                json_event("error", &ErrorDetail::from(error))
            }
        };
        self.pending.push_back(last);
    }
}

/// The SSE answer. The stream owns the run's receiver: a client that hangs up drops it, which ends the run.
fn stream(
    state: AppState,
    id: String,
    isolation: Isolation,
    events: mpsc::Receiver<RunEvent>,
    limit: u64,
    findings: Vec<Finding>,
) -> Response {
    let initial = StreamState {
        state,
        id,
        isolation,
        events,
        limit,
        stdout: Capture::default(),
        stderr: Capture::default(),
        pending: VecDeque::new(),
        done: false,
        findings,
    };
    let events = futures::stream::unfold(initial, |mut current| async move {
        loop {
            if let Some(event) = current.pending.pop_front() {
                return Some((Ok::<Event, Infallible>(event), current));
            }
            if current.done {
                return None;
            }
            let next = current.events.recv().await;
            current.absorb(next);
        }
    });
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}
