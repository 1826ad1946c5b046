//! `POST /v1/sandboxes/{id}/fork`: copies of a running sandbox, each a sandbox of its own (limits, quota, egress
//! policy) with the source's files; writes in one are invisible to the others. The work is `lifecycle::fork`'s.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{IdPath, JsonBody, running_sandbox};
use crate::api::schemas::SandboxBody;
use crate::auth::Tenant;
use crate::lifecycle::{self, check_timeout};
use crate::state::AppState;

/// `POST /v1/sandboxes/{id}/fork`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// How many copies, 1 to 16.
    pub count: u64,
    /// Seconds until the copies are destroyed. Default: the server's `default_timeout_s`.
    #[serde(default)]
    pub timeout_s: Option<u64>,
}

/// The copies a fork made.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ForkResponse {
    /// The new sandboxes, each running, in no particular relation to each other.
    pub sandboxes: Vec<SandboxBody>,
}

/// Fork a running sandbox into independent copies.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/fork", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox to copy")),
    request_body = ForkRequest,
    responses(
        (status = 201, description = "The copies, running, each with the source's spec, metadata and writable files \
            (home, /tmp, /dev/shm); a gVisor or microVM sandbox's copies have its memory too (its processes run on \
            in each), process-tier copies start fresh processes", body = ForkResponse),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox for this tenant", body = ErrorBody),
        (status = 409, description = "The sandbox is not running (ended, or paused without auto_resume), or its \
            files could not be copied (the message says why; no copy was kept)", body = ErrorBody),
        (status = 422, description = "count outside 1..=16, or timeout_s out of range", body = ErrorBody),
        (status = 429, description = "The tenant's quota has no room for that many copies; none was kept",
            body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn fork(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
    JsonBody(body): JsonBody<ForkRequest>,
) -> Result<(StatusCode, Json<ForkResponse>), ApiError> {
    let settings = state.settings();
    let expires_ms = check_timeout(settings, body.timeout_s.unwrap_or(settings.default_timeout_s))?;
    let source = running_sandbox(&state, &tenant, &id).await?;
    let copies = lifecycle::fork(&state, &tenant, &source, body.count, expires_ms).await?;
    Ok((StatusCode::CREATED, Json(ForkResponse { sandboxes: copies.into_iter().map(SandboxBody::from).collect() })))
}
