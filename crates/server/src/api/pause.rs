//! `POST /v1/sandboxes/{id}/pause` and `…/resume`: pausing takes a sandbox out of the running quota and stops its
//! timeout clock. With memory (the default) its tier keeps what it promises (the process tier: frozen, no CPU, memory
//! kept; gVisor: checkpointed to disk, nothing running); `{"mode": "filesystem"}` saves its files and releases it
//! entirely on every tier, and the resume starts fresh processes on them. While paused, every other request to it
//! answers 409 `paused`, unless it was created with `lifecycle.auto_resume`.

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use utoipa::ToSchema;

use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{IdPath, JsonBody, own_sandbox};
use crate::api::schemas::SandboxBody;
use crate::auth::Tenant;
use crate::lifecycle;
use crate::sandbox_lifecycle::PauseMode;
use crate::state::AppState;

/// `POST /v1/sandboxes/{id}/pause` body (optional: an empty body pauses with memory).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct PauseRequest {
    /// `memory` (default): processes and memory kept; `filesystem`: the files saved, everything else released.
    mode: PauseMode,
}

/// Pause a running sandbox.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/pause", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body(content = Option<PauseRequest>, description = "How to pause it (empty: with memory)"),
    responses(
        (status = 200, description = "Paused: `state` is `paused`, `pause_mode` says how", body = SandboxBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox for this tenant", body = ErrorBody),
        (status = 409, description = "Not running (paused already, or ended), or its tier cannot pause (the message \
            names the tiers that can)", body = ErrorBody),
        (status = 422, description = "Unknown `mode`", body = ErrorBody),
        (status = 429, description = "A filesystem pause over the tenant's `max_snapshot_bytes`", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn pause(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
    JsonBody(request): JsonBody<PauseRequest>,
) -> Result<Json<SandboxBody>, ApiError> {
    own_sandbox(&state, &tenant, &id).await?;
    lifecycle::pause(&state, &tenant, &id, request.mode).await?;
    Ok(Json(own_sandbox(&state, &tenant, &id).await?.into()))
}

/// Resume a paused sandbox: where it was (paused with memory), or on its saved files with fresh processes.
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
        (status = 503, description = "A sandbox paused to the filesystem could not be made again (it stays paused on \
            its files)", body = ErrorBody),
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
