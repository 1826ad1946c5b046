//! Sandbox lifecycle routes: create, list (with metadata filters), get, delete, and set the timeout.

use std::collections::BTreeMap;
use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use sandkasten_types::{Limits, SandboxSpec};

use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{IdPath, JsonBody, QueryParams, own_sandbox, running_sandbox};
use crate::api::isolation;
use crate::api::schemas::{CreateSandboxRequest, SandboxBody, SandboxList, TimeoutRequest};
use crate::auth::Tenant;
use crate::clock::now_ms;
use crate::config::ZygoteKind;
use crate::metrics::ExitReason;
use crate::pool::Claim;
use crate::runtime::FailureKind;
use crate::state::{AppState, Settings};
use crate::store::{SandboxRecord, SandboxState};
use crate::{egress, ids, validate};

/// The expiry (ms since the epoch) `timeout_s` seconds from now; 422 when out of range.
pub(crate) fn check_timeout(settings: Settings, timeout_s: u64) -> Result<i64, ApiError> {
    if !(1..=settings.max_timeout_s).contains(&timeout_s) {
        return Err(ApiError::unprocessable(format!(
            "timeout_s must be between 1 and {} seconds, got {timeout_s}",
            settings.max_timeout_s
        )));
    }
    Ok(now_ms().saturating_add(timeout_s as i64 * 1000))
}

/// Create a sandbox.
#[utoipa::path(
    post, path = "/v1/sandboxes", tag = "sandboxes",
    request_body = CreateSandboxRequest,
    responses(
        (status = 201, description = "Created and running", body = SandboxBody),
        (status = 400, description = "Malformed JSON, or a bad network pattern (named in the message)", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 422, description = "Limits, env, metadata or timeout out of range, an unknown secret or a misspelt \
            isolation (`unprocessable`), or an isolation tier that cannot run here (`tier_unavailable`: not available \
            yet, or not installed on this host; the message says how to install it)", body = ErrorBody),
        (status = 429, description = "A tenant quota would be exceeded", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn create(
    State(state): State<AppState>,
    tenant: Tenant,
    JsonBody(body): JsonBody<CreateSandboxRequest>,
) -> Result<(StatusCode, Json<SandboxBody>), ApiError> {
    let limits: Limits = body.limits.unwrap_or_default().into();
    limits.validate().map_err(|error| ApiError::unprocessable(format!("limits: {error}")))?;
    validate::environment(&body.env).map_err(ApiError::unprocessable)?;
    validate::metadata(&body.metadata).map_err(ApiError::unprocessable)?;
    let settings = state.settings();
    let expires_ms = check_timeout(settings, body.timeout_s.unwrap_or(settings.default_timeout_s))?;
    let spec = SandboxSpec {
        isolation: body.isolation.map(Into::into),
        template: body.template.unwrap_or_default().into(),
        limits,
        env: body.env,
        network: body.network.unwrap_or_default().into(),
        secrets: body.secrets,
    };
    let current = start_sandbox(&state, &tenant, spec, body.metadata, expires_ms).await?;
    Ok((StatusCode::CREATED, Json(current.into())))
}

/// SIGKILL.
pub(crate) const SIGKILL: i32 = 9;

/// Resolves the sandbox's isolation tier (the spec's, else the server's default; refused when it cannot run here),
/// admits the sandbox against the tenant's quota, records it and starts it in the runtime (or takes a ready one from
/// a warm pool serving its spec, tier included); on any failure nothing of it remains. Returns the running sandbox's
/// row. A pool member's zygote is not for the caller: it is killed.
pub(crate) async fn start_sandbox(
    state: &AppState,
    tenant: &Tenant,
    spec: SandboxSpec,
    metadata: BTreeMap<String, String>,
    expires_ms: i64,
) -> Result<SandboxRecord, ApiError> {
    let (record, zygote) = start_sandbox_with_zygote(state, tenant, spec, metadata, expires_ms).await?;
    if let Some((_, zygote)) = zygote
        && let Err(failure) = state.runtime().signal_command(&record.id, &zygote, SIGKILL).await
    {
        tracing::warn!(sandbox = %record.id, reason = %failure.message, "could not stop an unused zygote");
    }
    Ok(record)
}

/// As [`start_sandbox`], keeping the zygote of a pool member: its kind and command id, when there is one.
pub(crate) async fn start_sandbox_with_zygote(
    state: &AppState,
    tenant: &Tenant,
    mut spec: SandboxSpec,
    metadata: BTreeMap<String, String>,
    expires_ms: i64,
) -> Result<(SandboxRecord, Option<(ZygoteKind, String)>), ApiError> {
    // Before anything exists: a tier that cannot run here, a bad policy or an unknown secret is the caller's mistake,
    // and secrets add environment variables (which rule out a pool member, whose environment was fixed when it was
    // made).
    spec.isolation = Some(isolation::resolve(state, spec.isolation)?);
    let egress = egress::prepare(state.store(), &tenant.name, &mut spec).await?;
    let claiming = Instant::now();
    let claim = state.pools().claim(&spec, state.runtime(), state.metrics());
    let pool_outcome = claim.outcome();
    let claimed = match claim {
        Claim::Hit(claimed) => Some(claimed),
        Claim::Miss { .. } | Claim::NoPool => None,
    };
    let claim_seconds = claiming.elapsed().as_secs_f64();
    let id = match &claimed {
        Some(claimed) => claimed.id.clone(),
        None => ids::sandbox_id()?,
    };
    let zygote = claimed.as_ref().and_then(|claimed| claimed.zygote_kind.zip(claimed.zygote.clone()));
    let record = SandboxRecord {
        id: id.clone(),
        tenant: tenant.name.to_string(),
        state: SandboxState::Running,
        spec,
        metadata,
        created_ms: now_ms(),
        expires_ms,
        ended_ms: None,
        end_reason: None,
    };
    // The row (and the quota it takes) exists before the sandbox is handed out; a failed create removes it again.
    let admitted = state.store().admit_sandbox(record.clone(), tenant.quota).await;
    if !matches!(admitted, Ok(Ok(()))) {
        // Refused (or the store failed): a claimed pool member was never handed out, so it may go back.
        if let Some(claimed) = claimed {
            state.pools().give_back(claimed, state.metrics());
        }
        admitted??;
        return Err(ApiError::internal("sandbox admission failed"));
    }
    if let Some((class, hit)) = pool_outcome {
        state.pools().settle(class, hit, state.metrics());
    }
    let creating = Instant::now();
    let created = match claimed {
        Some(_) => Ok(claim_seconds),
        None => state.runtime().create(&id, &record.spec).await.map(|()| creating.elapsed().as_secs_f64()),
    };
    if let Ok(seconds) = created {
        // On a pool hit this is the claim (taking a ready sandbox), not the sandbox's creation long before.
        state.metrics().sandbox_create_finished(seconds);
    }
    if let Err(failure) = created {
        tracing::warn!(sandbox = %id, tenant = %tenant.name, kind = ?failure.kind, reason = %failure.message, "create failed");
        state.store().forget_sandbox(&id).await?;
        return Err(failure.into());
    }
    // Expiry may have ended the row while the runtime was creating; then the new sandbox must not outlive it.
    let current = state.store().sandbox(&tenant.name, &id).await?;
    let Some(current) = current.filter(|r| r.state == SandboxState::Running) else {
        destroy_quietly(state, &id).await;
        return Err(ApiError::conflict(format!("sandbox {id} ended while it was being created; create a new one")));
    };
    if let Err(failure) = state.egress().attach(state.runtime(), &id, &tenant.name, egress).await {
        tracing::warn!(sandbox = %id, reason = %failure.message, "egress attach failed");
        destroy_quietly(state, &id).await;
        state.store().forget_sandbox(&id).await?;
        return Err(failure.into());
    }
    state.metrics().sandbox_created();
    tracing::info!(
        sandbox = %id, tenant = %tenant.name, isolation = %current.spec.tier(),
        memory_bytes = current.spec.limits.memory_bytes, "sandbox created"
    );
    Ok((current, zygote))
}

/// Destroys a sandbox in the runtime, treating "already gone" as done (its E2B session, if any, goes with it).
pub(crate) async fn destroy_quietly(state: &AppState, id: &str) -> bool {
    state.egress().detach(id);
    let destroyed = destroy_in_runtime(state, id).await;
    // Again after the destroy: an attach racing this delete may have opened a door in between.
    state.egress().detach(id);
    if destroyed {
        state.e2b().close(id);
    }
    destroyed
}

async fn destroy_in_runtime(state: &AppState, id: &str) -> bool {
    match state.runtime().destroy(id).await {
        Ok(()) => true,
        Err(failure) if matches!(failure.kind, FailureKind::NotFound | FailureKind::SandboxGone) => true,
        Err(failure) => {
            tracing::error!(sandbox = id, kind = ?failure.kind, reason = %failure.message, "destroy failed");
            false
        }
    }
}

/// Which sandboxes a list request wants.
struct ListFilter {
    state: Option<SandboxState>,
    metadata: BTreeMap<String, String>,
}

fn parse_list_query(pairs: Vec<(String, String)>) -> Result<ListFilter, ApiError> {
    let mut filter = ListFilter { state: Some(SandboxState::Running), metadata: BTreeMap::new() };
    for (key, value) in pairs {
        if key == "state" {
            filter.state = match value.as_str() {
                "all" => None,
                name => Some(SandboxState::parse(name).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "state={name:?} is unknown: use running, destroyed, lost, expired or all"
                    ))
                })?),
            };
        } else if let Some(meta_key) = key.strip_prefix("metadata.") {
            validate::metadata_key(meta_key).map_err(ApiError::bad_request)?;
            filter.metadata.insert(meta_key.to_owned(), value);
        } else {
            return Err(ApiError::bad_request(format!(
                "unknown query parameter {key:?}: filter with state=… or metadata.KEY=VALUE"
            )));
        }
    }
    Ok(filter)
}

/// List the caller's sandboxes.
#[utoipa::path(
    get, path = "/v1/sandboxes", tag = "sandboxes",
    params(
        ("state" = Option<String>, Query, description = "running (default), destroyed, lost, expired or all"),
        ("metadata.KEY" = Option<String>, Query,
            description = "Only sandboxes whose metadata KEY equals the value; repeat for several keys (all must match)"),
    ),
    responses(
        (status = 200, description = "The caller's sandboxes, oldest first", body = SandboxList),
        (status = 400, description = "Unknown query parameter or state", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn list(
    State(state): State<AppState>,
    tenant: Tenant,
    QueryParams(pairs): QueryParams<Vec<(String, String)>>,
) -> Result<Json<SandboxList>, ApiError> {
    let filter = parse_list_query(pairs)?;
    let records = state.store().sandboxes(&tenant.name, filter.state).await?;
    let sandboxes = records
        .into_iter()
        .filter(|r| filter.metadata.iter().all(|(k, v)| r.metadata.get(k) == Some(v)))
        .map(SandboxBody::from)
        .collect();
    Ok(Json(SandboxList { sandboxes }))
}

/// Get one sandbox (in any state).
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "The sandbox", body = SandboxBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox for this tenant", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn get(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
) -> Result<Json<SandboxBody>, ApiError> {
    Ok(Json(own_sandbox(&state, &tenant, &id).await?.into()))
}

/// Destroy a sandbox. Deleting one that has already ended changes nothing.
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 204, description = "Destroyed (or had already ended)"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox for this tenant", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn delete(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
) -> Result<StatusCode, ApiError> {
    let record = own_sandbox(&state, &tenant, &id).await?;
    if record.state != SandboxState::Running {
        return Ok(StatusCode::NO_CONTENT);
    }
    end_running(&state, &tenant, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Destroys a running sandbox and records it as deleted.
pub(crate) async fn end_running(state: &AppState, tenant: &Tenant, id: &str) -> Result<(), ApiError> {
    if !destroy_quietly(state, id).await {
        return Err(ApiError::internal(format!("runtime could not destroy sandbox {id}")));
    }
    if state.store().end_sandbox(id, SandboxState::Destroyed, "deleted", now_ms()).await? {
        state.metrics().sandbox_exited(ExitReason::Deleted);
        tracing::info!(sandbox = %id, tenant = %tenant.name, "sandbox deleted");
    }
    Ok(())
}

/// Set a running sandbox's timeout: it is destroyed `timeout_s` seconds from now.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/timeout", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = TimeoutRequest,
    responses(
        (status = 200, description = "The sandbox with its new expiry", body = SandboxBody),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox for this tenant", body = ErrorBody),
        (status = 409, description = "The sandbox has ended", body = ErrorBody),
        (status = 422, description = "timeout_s out of range", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn set_timeout(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
    JsonBody(body): JsonBody<TimeoutRequest>,
) -> Result<Json<SandboxBody>, ApiError> {
    running_sandbox(&state, &tenant, &id).await?;
    let expires_ms = check_timeout(state.settings(), body.timeout_s)?;
    if !state.store().set_expiry(&tenant.name, &id, expires_ms).await? {
        // Ended between the check and the update.
        running_sandbox(&state, &tenant, &id).await?;
    }
    Ok(Json(own_sandbox(&state, &tenant, &id).await?.into()))
}
