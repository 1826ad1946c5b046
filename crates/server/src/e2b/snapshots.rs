//! E2B's snapshots over sandkasten's filesystem snapshots (`lifecycle::snapshot`): `Sandbox.create_snapshot`
//! (`POST /sandboxes/{id}/snapshots`), `Sandbox.list_snapshots` (`GET /snapshots`), `Sandbox.delete_snapshot`
//! (`DELETE /templates/{id}`: E2B's snapshots are templates) and `Sandbox.create(snapshot_id)` (the create in
//! `control` asks [`for_create`], then `lifecycle::start_on_files`).
//!
//! Ids: E2B's `snapshotID` is sandkasten's own snapshot id (`sn-` + 16 hex digits), unchanged, so it is what the
//! SDK passes back as a template to `Sandbox.create` and to `delete_snapshot`; `names` holds the name the snapshot
//! was given (none: empty). Names are labels only: creates and deletes take the id.
//!
//! E2B's default snapshot is `mode="full"` (memory and files). It is passed to `lifecycle::take_snapshot` as asked, so
//! the tiers decide: gVisor and microVM sandboxes save their memory; the process tier's refusal (400) tells the caller
//! to pass `mode="filesystem"`.
//! A filesystem snapshot is never taken in its place.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use sandkasten_types::Template;
use serde::{Deserialize, Serialize};

use crate::auth::Tenant;
use crate::e2b::auth::api_tenant;
use crate::e2b::error::{Code, E2bError};
use crate::e2b::lookup::{TEMPLATES, usable};
use crate::e2b::paging;
use crate::ids::is_snapshot_id;
use crate::lifecycle::{self, LifecycleError};
use crate::listing::{Order, Page, page};
use crate::state::AppState;
use crate::store_snapshots::{SnapshotRecord, SnapshotState};
use crate::validate;

/// `POST /sandboxes/{id}/snapshots` body: `memory` is what the SDK makes of `mode` (`"full"` → true,
/// `"filesystem"` → false, unset → absent, which is E2B's full snapshot).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct SnapshotRequest {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    memory: Option<bool>,
}

/// E2B's `SnapshotInfo`.
#[derive(Debug, Serialize)]
pub(crate) struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    snapshot_id: String,
    names: Vec<String>,
}

impl From<SnapshotRecord> for SnapshotInfo {
    fn from(record: SnapshotRecord) -> Self {
        SnapshotInfo { snapshot_id: record.id, names: record.name.into_iter().collect() }
    }
}

/// What to tell an E2B caller whose full snapshot was refused: the tier's reason, and the SDK's way out.
fn full_snapshot_refused(reason: &str) -> E2bError {
    E2bError::new(
        Code::FailedPrecondition,
        format!(
            "a full snapshot (memory and files, create_snapshot's default mode) cannot be taken: {reason}. To save \
             the sandbox's files only, call create_snapshot(mode=\"filesystem\")"
        ),
    )
}

/// `POST /sandboxes/{id}/snapshots`: 201 with the snapshot's `SnapshotInfo`; the sandbox keeps running.
pub(crate) async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<SnapshotInfo>), E2bError> {
    let tenant = api_tenant(&state, &headers)?;
    let request: SnapshotRequest = crate::e2b::error::json_body(&body)?;
    if let Some(name) = &request.name {
        validate::snapshot_name(name).map_err(E2bError::invalid)?;
    }
    let memory = request.memory.unwrap_or(true);
    let sandbox = usable(&state, &tenant, &id).await?;
    match lifecycle::take_snapshot(&state, &tenant, &sandbox, memory, request.name).await {
        Ok(taken) => Ok((StatusCode::CREATED, Json(taken.into()))),
        Err(LifecycleError::SnapshotRefused(reason)) if memory => Err(full_snapshot_refused(&reason)),
        Err(error) => Err(error.into()),
    }
}

/// The query of `GET /snapshots`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ListQuery {
    #[serde(rename = "sandboxID")]
    sandbox_id: Option<String>,
    name: Option<String>,
    limit: Option<String>,
    next_token: Option<String>,
}

/// `GET /snapshots`: the caller's ready snapshots, newest first (E2B's order), filtered by source sandbox
/// (`sandboxID`) and by name or id (`name`), paged by `limit` and `nextToken` on (creation time, id) cursors
/// (`e2b::paging`). One still being saved is not listed (it cannot be used yet).
pub(crate) async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, E2bError> {
    let tenant = api_tenant(&state, &headers)?;
    let Query(query) = query.map_err(|rejection| E2bError::invalid(rejection.body_text()))?;
    let limit = paging::limit(query.limit.as_deref())?;
    let after = paging::after(query.next_token.as_deref(), Order::Desc)?;
    let records = state.store().snapshots(&tenant.name).await.map_err(crate::api::error::ApiError::from)?;
    let matching: Vec<SnapshotRecord> = records
        .into_iter()
        .filter(|record| record.state == SnapshotState::Ready)
        .filter(|record| query.sandbox_id.as_ref().is_none_or(|sandbox| &record.source_sandbox == sandbox))
        .filter(|record| {
            query.name.as_ref().is_none_or(|name| &record.id == name || record.name.as_ref() == Some(name))
        })
        .collect();
    let page = page(matching, |record| (record.created_ms, record.id.as_str()), Order::Desc, limit, after.as_ref());
    Ok(paging::answer(Page {
        items: page.items.into_iter().map(SnapshotInfo::from).collect::<Vec<_>>(),
        next: page.next,
    }))
}

/// `DELETE /templates/{id}`, which `Sandbox.delete_snapshot` calls: 204 when the caller's snapshot is deleted, 404
/// (the SDK answers `False`) when there is none of that id. The built-in templates cannot be deleted.
pub(crate) async fn delete_template(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let tenant = api_tenant(&state, &headers)?;
    if TEMPLATES.contains(&id.as_str()) {
        return Err(E2bError::new(
            Code::FailedPrecondition,
            format!("template {id:?} is built into sandkasten and cannot be deleted; only snapshots (sn-…) can"),
        ));
    }
    if !is_snapshot_id(&id) {
        return Err(E2bError::new(Code::NotFound, format!("template {id:?} not found")));
    }
    lifecycle::delete_snapshot(&state, &tenant, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The snapshot `Sandbox.create(snapshot_id)` names, checked before anything is made: the caller's, ready, and of a
/// sandbox of the `e2b` template (every facade sandbox is one: user `user`, home `/home/user`).
pub(crate) async fn for_create(state: &AppState, tenant: &Tenant, id: &str) -> Result<SnapshotRecord, E2bError> {
    let snapshot = lifecycle::usable_snapshot(state, tenant, id).await?;
    if snapshot.spec.template != Template::E2b {
        return Err(E2bError::invalid(format!(
            "snapshot {id} holds the files of a {:?}-template sandbox (taken through the native API), and E2B \
             sandboxes use the e2b template (home /home/user): start it with POST /v1/sandboxes {{\"snapshot\": \"{id}\"}}",
            snapshot.spec.template
        )));
    }
    Ok(snapshot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_names_the_sdks_filesystem_mode() {
        let error = full_snapshot_refused("no tier can");
        assert_eq!(error.code, Code::FailedPrecondition);
        assert!(error.message.contains("mode=\"filesystem\""), "{}", error.message);
    }

    #[test]
    fn an_absent_mode_is_a_full_snapshot() -> Result<(), serde_json::Error> {
        let request: SnapshotRequest = serde_json::from_str("{}")?;
        assert!(request.memory.unwrap_or(true));
        let request: SnapshotRequest = serde_json::from_str(r#"{"memory": false, "name": "n"}"#)?;
        assert_eq!((request.memory, request.name.as_deref()), (Some(false), Some("n")));
        Ok(())
    }
}
