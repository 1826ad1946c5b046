//! Extractors whose failures are `ApiError`s: JSON bodies (size-limited while streaming, any content type),
//! query strings, raw bodies, and the lookup of the caller's own sandbox.

use axum::extract::{FromRef, FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::header::CONTENT_LENGTH;
use axum::http::request::Parts;
use futures::StreamExt;
use serde::de::DeserializeOwned;

use crate::api::error::ApiError;
use crate::auth::Tenant;
use crate::ids::is_sandbox_id;
use crate::lifecycle::note_lost;
use crate::state::AppState;
use crate::store::{SandboxRecord, SandboxState};

/// Reads a body of at most `limit` bytes. A declared `Content-Length` over the limit is refused before reading;
/// otherwise reading stops at the first chunk past it, so an oversized body is never buffered whole.
pub(crate) async fn read_limited(request: Request, limit: u64, what: &str) -> Result<Vec<u8>, ApiError> {
    let too_large = || ApiError::payload_too_large(format!("{what} is larger than the limit of {limit} bytes"));
    let declared = request.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit) {
        return Err(too_large());
    }
    let mut stream = request.into_body().into_data_stream();
    let mut buffer = Vec::with_capacity(declared.map_or(0, |length| length.min(1 << 20) as usize));
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|error| ApiError::bad_request(format!("could not read the request body: {error}")))?;
        if (buffer.len() + chunk.len()) as u64 > limit {
            return Err(too_large());
        }
        buffer.extend_from_slice(&chunk);
    }
    Ok(buffer)
}

/// A JSON request body. The content type is not checked (so `curl -d` works); an empty body is `{}`. Syntax errors
/// are 400, well-formed JSON of the wrong shape (unknown field, wrong type, missing field) is 422.
#[derive(Debug)]
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T, S> FromRequest<S> for JsonBody<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
    AppState: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let limit = AppState::from_ref(state).settings().max_json_bytes;
        let bytes = read_limited(request, limit, "the JSON body").await?;
        let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) { b"{}" } else { &bytes };
        serde_json::from_slice(text).map(JsonBody).map_err(|error| {
            let message = format!("invalid JSON body: {error}");
            match error.classify() {
                serde_json::error::Category::Data => ApiError::unprocessable(message),
                _ => ApiError::bad_request(message),
            }
        })
    }
}

/// A query string; anything that does not fit `T` is a 400.
#[derive(Debug)]
pub(crate) struct QueryParams<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Query(value) = Query::<T>::from_request_parts(parts, state).await?;
        Ok(QueryParams(value))
    }
}

/// A `{id}` path segment; a segment that cannot be decoded is a 400.
#[derive(Debug)]
pub(crate) struct IdPath(pub(crate) String);

impl<S: Send + Sync> FromRequestParts<S> for IdPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(id) = Path::<String>::from_request_parts(parts, state).await?;
        Ok(IdPath(id))
    }
}

/// The caller's sandbox `id` in any state; 404 when it does not exist or belongs to another tenant.
pub(crate) async fn own_sandbox(state: &AppState, tenant: &Tenant, id: &str) -> Result<SandboxRecord, ApiError> {
    if !is_sandbox_id(id) {
        return Err(ApiError::sandbox_not_found(id));
    }
    state.store().sandbox(&tenant.name, id).await?.ok_or_else(|| ApiError::sandbox_not_found(id))
}

/// The caller's sandbox `id`, which must be running: 404 as in `own_sandbox`, 409 when it has ended.
pub(crate) async fn running_sandbox(state: &AppState, tenant: &Tenant, id: &str) -> Result<SandboxRecord, ApiError> {
    // A pause or resume in progress settles first: nothing reaches a sandbox half paused.
    state.transitions().settled(id).await;
    let mut record = own_sandbox(state, tenant, id).await?;
    if record.state == SandboxState::Paused {
        if !record.lifecycle.auto_resume {
            return Err(crate::lifecycle::LifecycleError::Paused(id.to_owned()).into());
        }
        crate::lifecycle::ensure_resumed(state, tenant, id).await?;
        record = own_sandbox(state, tenant, id).await?;
    }
    if record.state != SandboxState::Running {
        let reason = record.end_reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default();
        return Err(ApiError::conflict(format!(
            "sandbox {id} is {}{reason} and can no longer be used; create a new one",
            record.state
        )));
    }
    Ok(record)
}

/// A runtime call's result as the API answers it: the value, or `runtime_error` of the failure.
pub(crate) async fn runtime_result<T>(
    state: &AppState,
    id: &str,
    result: Result<T, sandkasten_types::Failure>,
) -> Result<T, ApiError> {
    match result {
        Ok(value) => Ok(value),
        Err(failure) => Err(runtime_error(state, id, failure).await),
    }
}

/// Turns a runtime failure into an API error; `SandboxGone` also ends the sandbox (`lifecycle::note_lost`).
pub(crate) async fn runtime_error(state: &AppState, id: &str, failure: sandkasten_types::Failure) -> ApiError {
    match note_lost(state, id, failure).await {
        Ok(failure) => ApiError::from(failure),
        Err(error) => ApiError::from(error),
    }
}
