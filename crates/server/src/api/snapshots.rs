//! Snapshots: `POST /v1/sandboxes/{id}/snapshots` saves a running sandbox's writable files (home, /tmp, /dev/shm) to
//! the snapshot store, `GET /v1/snapshots` and `GET/DELETE /v1/snapshots/{id}` list, show and delete them, and
//! `POST /v1/sandboxes {"snapshot": ID}` (in `sandboxes`) starts a sandbox on a snapshot's files. The work is
//! `lifecycle::snapshot`'s.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use sandkasten_types::Tier;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{IdPath, JsonBody, running_sandbox};
use crate::auth::Tenant;
use crate::clock::rfc3339;
use crate::ids::is_snapshot_id;
use crate::lifecycle;
use crate::state::AppState;
use crate::store_snapshots::{SnapshotRecord, SnapshotState};
use crate::transfers::TransferProgress;
use crate::validate;

/// `POST /v1/sandboxes/{id}/snapshots`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// Save processes and memory too (only on tiers that can; 409 names them). Default false: the files.
    #[serde(default)]
    pub memory: bool,
    /// A name for it (at most 128 characters), shown in listings.
    #[serde(default)]
    pub name: Option<String>,
}

/// Where a snapshot is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotStateName {
    /// Being written to the store (a create from it answers 409 until it is ready).
    Saving,
    /// Stored whole: it can be restored.
    Ready,
}

/// One snapshot.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SnapshotBody {
    /// Id, `sn-` + 16 hex digits.
    #[schema(example = "sn-4f1c0e2b9a7d3c55")]
    pub snapshot_id: String,
    /// Its name, when it was given one.
    pub name: Option<String>,
    /// The sandbox it was taken of.
    pub sandbox_id: String,
    /// The source sandbox's isolation tier (a sandbox made from it runs there unless the create names another).
    #[schema(value_type = crate::api::isolation::IsolationName)]
    pub isolation: Tier,
    /// The source sandbox's template (a sandbox made from it has the same).
    pub template: String,
    /// Whether it holds processes and memory as well as files.
    pub memory: bool,
    /// Saving or ready.
    pub state: SnapshotStateName,
    /// The saved files' bytes, uncompressed (the tar archive).
    pub size_bytes: u64,
    /// Bytes it takes in the store, compressed: what counts against the tenant's `max_snapshot_bytes`.
    pub stored_bytes: u64,
    /// The directories saved.
    pub dirs: Vec<String>,
    /// When it was taken (RFC 3339, UTC).
    pub created_at: String,
    /// Transfers of it in progress: its own save while `saving`, and sandboxes being restored from it, each with the
    /// bytes moved so far (what the CLI's progress bars show).
    pub transfers: Vec<TransferProgress>,
}

impl From<SnapshotRecord> for SnapshotBody {
    fn from(record: SnapshotRecord) -> Self {
        SnapshotBody {
            snapshot_id: record.id,
            name: record.name,
            sandbox_id: record.source_sandbox,
            isolation: record.spec.tier(),
            template: crate::built_templates::name_of(&record.spec),
            memory: record.memory,
            state: match record.state {
                SnapshotState::Saving => SnapshotStateName::Saving,
                SnapshotState::Ready => SnapshotStateName::Ready,
            },
            size_bytes: record.size_bytes,
            stored_bytes: record.stored_bytes,
            dirs: record.dirs,
            created_at: rfc3339(record.created_ms),
            transfers: Vec::new(),
        }
    }
}

/// `GET /v1/snapshots`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SnapshotList {
    /// The tenant's snapshots, oldest first.
    pub snapshots: Vec<SnapshotBody>,
}

/// Take a snapshot of a running sandbox's files.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/snapshots", tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = SnapshotRequest,
    responses(
        (status = 201, description = "Saved: the sandbox's home, /tmp and /dev/shm as the sandbox user can read them \
            (the sandbox keeps running)", body = SnapshotBody),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox for this tenant", body = ErrorBody),
        (status = 409, description = "The sandbox is not running (ended, or paused without auto_resume), it ended \
            while being saved, or memory was asked of a tier that cannot (the message names the tiers that can)",
            body = ErrorBody),
        (status = 422, description = "A name longer than 128 characters or with control characters", body = ErrorBody),
        (status = 429, description = "The tenant's snapshots would take more than max_snapshot_bytes; nothing was kept",
            body = ErrorBody),
        (status = 503, description = "The snapshot store failed (`store_failed`); nothing was kept", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn create(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
    JsonBody(body): JsonBody<SnapshotRequest>,
) -> Result<(StatusCode, Json<SnapshotBody>), ApiError> {
    if let Some(name) = &body.name {
        validate::snapshot_name(name).map_err(ApiError::unprocessable)?;
    }
    let sandbox = running_sandbox(&state, &tenant, &id).await?;
    let taken = lifecycle::take_snapshot(&state, &tenant, &sandbox, body.memory, body.name).await?;
    Ok((StatusCode::CREATED, Json(taken.into())))
}

/// List the caller's snapshots.
#[utoipa::path(
    get, path = "/v1/snapshots", tag = "snapshots",
    responses(
        (status = 200, description = "The tenant's snapshots, oldest first", body = SnapshotList),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn list(State(state): State<AppState>, tenant: Tenant) -> Result<Json<SnapshotList>, ApiError> {
    let records = state.store().snapshots(&tenant.name).await?;
    Ok(Json(SnapshotList { snapshots: records.into_iter().map(|record| with_transfers(&state, record)).collect() }))
}

/// A snapshot's body with its transfers in progress.
fn with_transfers(state: &AppState, record: SnapshotRecord) -> SnapshotBody {
    let transfers = state.transfers().of(&record.id);
    SnapshotBody { transfers, ..record.into() }
}

fn snapshot_not_found(id: &str) -> ApiError {
    ApiError::from(lifecycle::LifecycleError::SnapshotNotFound(id.to_owned()))
}

/// Get one snapshot.
#[utoipa::path(
    get, path = "/v1/snapshots/{id}", tag = "snapshots",
    params(("id" = String, Path, description = "Snapshot id")),
    responses(
        (status = 200, description = "The snapshot", body = SnapshotBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such snapshot for this tenant", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn get(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> Result<Json<SnapshotBody>, ApiError> {
    if !is_snapshot_id(&id) {
        return Err(snapshot_not_found(&id));
    }
    let record = state.store().snapshot(&tenant.name, &id).await?;
    Ok(Json(with_transfers(&state, record.ok_or_else(|| snapshot_not_found(&id))?)))
}

/// Delete a snapshot; its chunks that no other snapshot uses are removed from the store.
#[utoipa::path(
    delete, path = "/v1/snapshots/{id}", tag = "snapshots",
    params(("id" = String, Path, description = "Snapshot id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such snapshot for this tenant", body = ErrorBody),
        (status = 409, description = "It is still being saved", body = ErrorBody),
        (status = 503, description = "The snapshot store failed (`store_failed`); it is kept", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn delete(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    if !is_snapshot_id(&id) {
        return Err(snapshot_not_found(&id));
    }
    lifecycle::delete_snapshot(&state, &tenant, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The snapshot a create names, checked before anything is made: the caller's, ready.
pub(crate) async fn snapshot_for_create(
    state: &AppState,
    tenant: &Tenant,
    id: &str,
) -> Result<SnapshotRecord, ApiError> {
    if !is_snapshot_id(id) {
        return Err(snapshot_not_found(id));
    }
    Ok(lifecycle::usable_snapshot(state, tenant, id).await?)
}
