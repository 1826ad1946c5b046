//! `GET /v1/sandboxes/{id}/commands/{command_id}/stream`: a background command's output as server-sent events — the
//! retained output first (replay), then live output, then `exit`. Each output event's `id` is the byte offset after
//! it (both streams counted), so a client reconnects with `Last-Event-ID` (or `?since=`) and continues where it left
//! off; without either, the stream replays from the start of what is retained. Any number of clients may listen.

use std::convert::Infallible;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use sandkasten_types::{CommandEvent, Isolation};
use tokio_stream::wrappers::ReceiverStream;

use crate::api::command_schemas::StreamQuery;
use crate::api::commands::{CommandPath, own_command};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{QueryParams, runtime_error};
use crate::api::output;
use crate::api::output::json_event;
use crate::api::schemas::ExitEvent;
use crate::auth::Tenant;
use crate::state::AppState;

/// The offset to start from: `Last-Event-ID` when sent, else `?since=`, else 0.
fn start_offset(headers: &HeaderMap, query: &StreamQuery) -> Result<u64, ApiError> {
    match headers.get("last-event-id") {
        Some(value) => {
            value.to_str().ok().and_then(|text| text.trim().parse().ok()).ok_or_else(|| {
                ApiError::bad_request("Last-Event-ID must be a byte offset (an event id of this stream)")
            })
        }
        None => Ok(query.since.unwrap_or(0)),
    }
}

fn to_event(event: CommandEvent, isolation: &Isolation) -> Option<Event> {
    match event {
        CommandEvent::Output { chunk, offset } => {
            let name = chunk.stream.as_str();
            output::event(&chunk.data).map(|data| json_event(name, &data).id(offset.to_string()))
        }
        CommandEvent::Ended(status) => {
            let exit = status.exit.unwrap_or_default();
            let ended = status.ended_ms.unwrap_or(status.started_ms);
            let truncated = [status.stdout_truncated, status.stderr_truncated];
            let duration_ms = ended.saturating_sub(status.started_ms) as f64;
            Some(json_event("exit", &ExitEvent::new(isolation.clone(), exit, truncated, duration_ms)))
        }
    }
}

/// Stream a background command's output (replay, then live, then its exit).
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/commands/{command_id}/stream", tag = "exec",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("command_id" = String, Path, description = "Command id"),
        StreamQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "Continue after this event id (a byte offset)"),
    ),
    responses(
        (status = 200, description = "Server-sent events: `stdout` and `stderr` (data: OutputEvent; `id`: the byte \
            offset after the event, both streams counted) from the requested offset on — what is retained first, \
            then live — and finally one `exit` (data: ExitEvent; exit_code and signal are both null when the sandbox \
            ended before the command's exit was known). Output past the sandbox's `limits.output_bytes` per stream \
            is not retained (the exit event says truncated)", content(
            (String = "text/event-stream"),
        )),
        (status = 400, description = "Malformed since or Last-Event-ID", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or command for this tenant", body = ErrorBody),
        (status = 409, description = "The sandbox has ended", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn stream(
    State(state): State<AppState>,
    tenant: Tenant,
    CommandPath(id, command): CommandPath,
    headers: HeaderMap,
    QueryParams(query): QueryParams<StreamQuery>,
) -> Result<Response, ApiError> {
    let sandbox = own_command(&state, &tenant, &id, &command).await?;
    let isolation = sandbox.isolation.clone();
    let offset = start_offset(&headers, &query)?;
    let events = match state.runtime().stream_command(&id, &command, offset).await {
        Ok(events) => events,
        Err(failure) => return Err(runtime_error(&state, &id, failure).await),
    };
    // A client that leaves drops the stream, and with it the runtime's listener.
    let sse = ReceiverStream::new(events)
        .filter_map(move |event| std::future::ready(to_event(event, &isolation).map(Ok::<_, Infallible>)));
    Ok(Sse::new(sse).keep_alive(KeepAlive::default()).into_response())
}
