//! `POST /v1/sandboxes/{id}/pause` and `…/resume`: pausing takes a sandbox out of the running quota and stops its
//! timeout clock; its tier keeps what it promises (the process tier: frozen, no CPU, memory kept). While paused,
//! every other request to it answers 409 `paused`, unless it was created with `lifecycle.auto_resume`.

use axum::Json;
use axum::extract::State;

use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{IdPath, own_sandbox};
use crate::api::schemas::SandboxBody;
use crate::auth::Tenant;
use crate::lifecycle;
use crate::state::AppState;

/// Pause a running sandbox.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/pause", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "Paused: `state` is `paused`", body = SandboxBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox for this tenant", body = ErrorBody),
        (status = 409, description = "Not running (paused already, or ended), or its tier cannot pause (the message \
            names the tiers that can)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn pause(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
) -> Result<Json<SandboxBody>, ApiError> {
    own_sandbox(&state, &tenant, &id).await?;
    lifecycle::pause(&state, &id).await?;
    Ok(Json(own_sandbox(&state, &tenant, &id).await?.into()))
}

/// Resume a paused sandbox where it was.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/resume", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "Running again; its expiry moved on by the time it was paused",
            body = SandboxBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox for this tenant", body = ErrorBody),
        (status = 409, description = "Not paused", body = ErrorBody),
        (status = 429, description = "The tenant's running quota has no room for it", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn resume(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
) -> Result<Json<SandboxBody>, ApiError> {
    own_sandbox(&state, &tenant, &id).await?;
    lifecycle::resume(&state, &tenant, &id).await?;
    Ok(Json(own_sandbox(&state, &tenant, &id).await?.into()))
}
