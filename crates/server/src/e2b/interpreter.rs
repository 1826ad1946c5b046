//! The code interpreter's routes (port 49999 in E2B): `POST /execute` runs a cell in a Python or JavaScript context
//! and streams one JSON object per line (`stdout`, `stderr`, `result` with `text`/`html`/`png`/`svg`, `error`
//! with `name`/`value`/`traceback`, `number_of_executions`, `end_of_execution`, and a `keepalive` every few seconds
//! while nothing else is sent); `/contexts` creates, lists, removes and restarts contexts. Both map onto the
//! runtime's code contexts.
//!
//! As E2B's server does, a cell whose client leaves (the SDK's `timeout` ran out) is interrupted so the context's
//! next cell can run (the keepalives make a gone client noticed), and a sandbox killed during a cell breaks the
//! stream off (the SDK then finds the sandbox gone and raises its "killed" error) instead of ending it normally.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sandkasten_types::{CellOutcome, CodeRun, ContextInfo, FailureKind};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

use crate::api::code::{scanned, start};
use crate::api::contexts::is_context_id;
use crate::api::running::pump;
use crate::e2b::auth::{runtime_failure, sandbox_access};
use crate::e2b::error::{Code, E2bError, json_body};
use crate::e2b::languages::kernel_for;
use crate::e2b::paths::{E2B_HOME, to_sandbox};
use crate::state::AppState;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ExecuteRequest {
    code: String,
    context_id: Option<String>,
    language: Option<String>,
    env_vars: Option<std::collections::BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ContextRequest {
    language: Option<String>,
    cwd: Option<String>,
}

fn context_json(context: &ContextInfo) -> Value {
    let cwd = context.cwd.as_deref().unwrap_or(E2B_HOME);
    json!({ "id": context.id, "language": context.language.as_str(), "cwd": cwd })
}

fn timestamp_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default()
}

/// A value's text as E2B's server hands it on: one pair of enclosing quotes taken off (`'abc'` → `abc`, for every
/// language: a Python `repr` and a JavaScript `util.inspect` of a string alike).
fn e2b_text(text: &str) -> String {
    let quoted = text.len() >= 2
        && ((text.starts_with('\'') && text.ends_with('\'')) || (text.starts_with('"') && text.ends_with('"')));
    if quoted { text[1..text.len() - 1].to_owned() } else { text.to_owned() }
}

/// The error name E2B's server gives a cell whose interpreter died under it (and was started again).
const CONTEXT_RESTARTING: &str = "ContextRestarting";

/// The lines that follow a cell's output: its results, its error, its execution count and the end.
fn outcome_lines(outcome: &CellOutcome) -> Vec<Value> {
    let mut lines = Vec::new();
    for result in &outcome.results {
        let mut line = json!({ "type": "result", "is_main_result": result.is_main_result });
        let text = result.text_plain.as_deref().map(e2b_text);
        let fields = [
            ("text", &text),
            ("html", &result.text_html),
            ("png", &result.image_png),
            ("svg", &result.image_svg),
            ("markdown", &result.text_markdown),
            ("latex", &result.text_latex),
            ("jpeg", &result.image_jpeg),
        ];
        if let Some(object) = line.as_object_mut() {
            for (name, value) in fields {
                if let Some(value) = value {
                    object.insert(name.into(), Value::String(value.clone()));
                }
            }
            if let Some(data) = &result.application_json {
                object.insert("json".into(), data.clone());
            }
            if let Some(chart) = &result.chart {
                object.insert("chart".into(), chart.clone());
            }
        }
        lines.push(line);
    }
    if let Some(error) = &outcome.error {
        let name = if outcome.context_restarted && error.name == "KernelRestarted" {
            CONTEXT_RESTARTING
        } else {
            error.name.as_str()
        };
        lines.push(json!({
            "type": "error", "name": name, "value": error.value, "traceback": error.traceback.join("\n"),
        }));
    }
    lines.push(json!({ "type": "number_of_executions", "execution_count": outcome.execution_count }));
    lines.push(json!({ "type": "end_of_execution" }));
    lines
}

fn line(value: &Value) -> Result<Bytes, std::io::Error> {
    let mut text = value.to_string();
    text.push('\n');
    Ok(Bytes::from(text))
}

/// `POST /execute`.
pub(crate) async fn execute(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, E2bError> {
    let access = sandbox_access(&state, &headers).await?;
    let request: ExecuteRequest = json_body(&body)?;
    let env = request.env_vars.unwrap_or_default();
    crate::validate::environment(&env).map_err(E2bError::invalid)?;
    let (language, context_id) = match request.context_id {
        Some(context) if !is_context_id(&context) => {
            return Err(E2bError::new(Code::NotFound, format!("context {context} not found")));
        }
        Some(context) => (None, Some(context)),
        None => (Some(kernel_for(&state, &access, request.language.as_deref()).await?), None),
    };
    if let Some(context) = &context_id {
        // An unknown context is a 404 before anything streams, as E2B answers it (`NotFoundException`).
        let contexts = match state.runtime().list_contexts(&access.id).await {
            Ok(contexts) => contexts,
            Err(failure) => return Err(runtime_failure(&state, &access.id, failure).await),
        };
        if !contexts.iter().any(|known| &known.id == context) {
            return Err(E2bError::new(Code::NotFound, format!("context {context} not found")));
        }
    }
    let limits = &access.record.spec.limits;
    let run = CodeRun {
        language,
        code: request.code,
        context_id,
        timeout_ms: limits.timeout_ms,
        max_output_bytes: limits.output_bytes,
        env,
    };
    // The tenant's scan policy refuses in enforce (the facade's answers have no place for warn findings).
    scanned(&state, &access.tenant, &access.id, None, &run).await?;
    let (interrupt, interrupted) = oneshot::channel();
    let started = start(&state, &access.id, run, Some(interrupted));
    let (sender, receiver) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let watcher = tokio::spawn(watch_client(sender.clone(), interrupt));
    tokio::spawn(async move {
        let result = pump(started, |chunk| {
            let kind = chunk.stream.as_str();
            let text = String::from_utf8_lossy(&chunk.data).into_owned();
            let sender = sender.clone();
            async move {
                let value = json!({ "type": kind, "text": text, "timestamp": timestamp_ns() as u64 });
                sender.send(line(&value)).await.ok();
            }
        })
        .await;
        watcher.abort();
        let lines = match result {
            Ok(outcome) => outcome_lines(&outcome),
            Err(failure) => {
                let gone = failure.kind == FailureKind::SandboxGone;
                let error = runtime_failure(&state, &access.id, failure).await;
                if gone {
                    // Broken off, as a killed sandbox's connection is: the SDK then asks whether it still runs.
                    let broken = std::io::Error::new(std::io::ErrorKind::ConnectionAborted, error.message);
                    sender.send(Err(broken)).await.ok();
                    return;
                }
                vec![json!({ "type": "error", "name": "SandboxError", "value": error.message, "traceback": "" })]
            }
        };
        for value in lines {
            sender.send(line(&value)).await.ok();
        }
    });
    let body = Body::from_stream(ReceiverStream::new(receiver));
    Ok(([(CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"))], body).into_response())
}

/// How often a cell's stream carries a `keepalive` line while it runs (as E2B's server sends them): writing is how a
/// client that has left is noticed.
const KEEPALIVE: Duration = Duration::from_secs(2);

/// Sends keepalives to the cell's client until it leaves, then interrupts the cell (aborted when the cell ends).
async fn watch_client(sender: mpsc::Sender<Result<Bytes, std::io::Error>>, interrupt: oneshot::Sender<()>) {
    let keepalive = json!({ "type": "keepalive" });
    loop {
        tokio::select! {
            () = sender.closed() => break,
            () = tokio::time::sleep(KEEPALIVE) => {
                if sender.send(line(&keepalive)).await.is_err() {
                    break;
                }
            }
        }
    }
    tracing::info!("the client of a cell left; interrupting the cell");
    interrupt.send(()).ok();
}

/// `POST /contexts`.
pub(crate) async fn create_context(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, E2bError> {
    let access = sandbox_access(&state, &headers).await?;
    let request: ContextRequest = json_body(&body)?;
    let cwd = request.cwd.as_deref().map(to_sandbox).transpose()?;
    let language = kernel_for(&state, &access, request.language.as_deref()).await?;
    match state.runtime().create_context(&access.id, language, cwd).await {
        Ok(context) => Ok(Json(context_json(&context))),
        Err(failure) => Err(runtime_failure(&state, &access.id, failure).await),
    }
}

/// `GET /contexts`.
pub(crate) async fn list_contexts(State(state): State<AppState>, headers: HeaderMap) -> Result<Json<Value>, E2bError> {
    let access = sandbox_access(&state, &headers).await?;
    match state.runtime().list_contexts(&access.id).await {
        Ok(contexts) => Ok(Json(Value::Array(contexts.iter().map(context_json).collect()))),
        Err(failure) => Err(runtime_failure(&state, &access.id, failure).await),
    }
}

fn known_context(context: &str) -> Result<(), E2bError> {
    if is_context_id(context) {
        Ok(())
    } else {
        Err(E2bError::new(Code::NotFound, format!("context {context} not found")))
    }
}

/// `DELETE /contexts/{id}`.
pub(crate) async fn remove_context(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(context): Path<String>,
) -> Result<StatusCode, E2bError> {
    let access = sandbox_access(&state, &headers).await?;
    known_context(&context)?;
    match state.runtime().remove_context(&access.id, &context).await {
        Ok(()) => Ok(StatusCode::NO_CONTENT),
        Err(failure) => Err(runtime_failure(&state, &access.id, failure).await),
    }
}

/// `POST /contexts/{id}/restart`.
pub(crate) async fn restart_context(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(context): Path<String>,
) -> Result<StatusCode, E2bError> {
    let access = sandbox_access(&state, &headers).await?;
    known_context(&context)?;
    match state.runtime().restart_context(&access.id, &context).await {
        Ok(_) => Ok(StatusCode::NO_CONTENT),
        Err(failure) => Err(runtime_failure(&state, &access.id, failure).await),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandkasten_types::{CellError, CellResult};

    #[test]
    fn outcome_lines_are_what_the_sdk_parses() {
        let outcome = CellOutcome {
            context_id: "ctx-0000000000000000".into(),
            execution_count: 2,
            results: vec![CellResult {
                text_plain: Some("3".into()),
                image_png: Some("iVBO".into()),
                is_main_result: true,
                ..CellResult::default()
            }],
            error: Some(CellError {
                name: "ValueError".into(),
                value: "bad".into(),
                traceback: vec!["a".into(), "b".into()],
            }),
            ..CellOutcome::default()
        };
        let lines = outcome_lines(&outcome);
        assert_eq!(lines[0], json!({"type": "result", "is_main_result": true, "text": "3", "png": "iVBO"}));
        assert_eq!(lines[1], json!({"type": "error", "name": "ValueError", "value": "bad", "traceback": "a\nb"}));
        assert_eq!(lines[2], json!({"type": "number_of_executions", "execution_count": 2}));
        assert_eq!(lines[3], json!({"type": "end_of_execution"}));
    }

    #[test]
    fn texts_lose_one_pair_of_enclosing_quotes_as_e2b_gives_them() {
        assert_eq!(e2b_text("'abc'"), "abc");
        assert_eq!(e2b_text("\"it's\""), "it's");
        assert_eq!(e2b_text("42"), "42");
        assert_eq!(e2b_text("'"), "'", "a lone quote is no pair");
        assert_eq!(e2b_text("['a', 'b']"), "['a', 'b']");
    }

    #[test]
    fn a_lost_interpreter_is_context_restarting() {
        let outcome = CellOutcome {
            error: Some(CellError { name: "KernelRestarted".into(), value: "ended".into(), traceback: Vec::new() }),
            context_restarted: true,
            ..CellOutcome::default()
        };
        assert_eq!(outcome_lines(&outcome)[0]["name"], "ContextRestarting");
    }
}
