//! `Sandbox.fork(count=N)` (`POST /sandboxes/{id}/fork`): N copies of a running sandbox through `lifecycle::fork`,
//! each a sandbox of its own with the source's spec, metadata and files (processes start fresh: memory is not
//! copied), answered as E2B's list of `SandboxForkResult`s, each with the `Sandbox` the SDK connects to.
//!
//! E2B starts each fork on its own and may answer some of them as errors; sandkasten's fork is all or nothing, so
//! a failure fails the whole request (the SDK raises it) and no copy is kept.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};

use crate::e2b::auth::api_tenant;
use crate::e2b::control::{SandboxCreated, session_of};
use crate::e2b::error::E2bError;
use crate::e2b::lookup::usable;
use crate::lifecycle::{self, abandon, check_timeout};
use crate::state::AppState;

/// E2B's default fork count, when the request names none.
const DEFAULT_COUNT: u64 = 1;

/// `POST /sandboxes/{id}/fork` body (`SandboxForkRequest`).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ForkRequest {
    /// Seconds until the copies end (default: the server's `default_timeout_s`).
    #[serde(default)]
    timeout: Option<u64>,
    /// How many copies (1 to 16 here; default 1).
    #[serde(default)]
    count: Option<u64>,
}

/// E2B's `SandboxForkResult`: the copy (this facade never answers a per-fork `error`).
#[derive(Debug, Serialize)]
pub(crate) struct ForkResult {
    sandbox: SandboxCreated,
}

/// `POST /sandboxes/{id}/fork`: 201 with one result per copy.
pub(crate) async fn fork(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<Vec<ForkResult>>), E2bError> {
    let tenant = api_tenant(&state, &headers)?;
    let request: ForkRequest = crate::e2b::error::json_body(&body)?;
    let settings = state.settings();
    let expires_ms = check_timeout(settings, request.timeout.unwrap_or(settings.default_timeout_s))?;
    let source = usable(&state, &tenant, &id).await?;
    let copies = lifecycle::fork(&state, &tenant, &source, request.count.unwrap_or(DEFAULT_COUNT), expires_ms).await?;
    // The copies answer to the template name the source was created with.
    let template = state.e2b().get(&source.id).map(|session| session.template);
    let sessions: Result<Vec<ForkResult>, E2bError> = copies
        .iter()
        .map(|copy| Ok(ForkResult { sandbox: session_of(&state, copy, &tenant, template.as_deref())? }))
        .collect();
    match sessions {
        Ok(results) => Ok((StatusCode::CREATED, Json(results))),
        Err(error) => {
            // All or nothing, as the fork itself: copies the caller cannot reach are not kept.
            for copy in &copies {
                abandon(&state, &copy.id).await;
            }
            Err(error)
        }
    }
}
