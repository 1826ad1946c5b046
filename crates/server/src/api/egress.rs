//! Egress routes of a sandbox: change its network policy live, read its audit trail.

use axum::Json;
use axum::extract::State;
use sandkasten_types::NetworkPolicy;

use crate::api::egress_schemas::{EgressLog, NetworkPolicyBody};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{IdPath, JsonBody, QueryParams, own_sandbox, running_sandbox};
use crate::auth::Tenant;
use crate::egress;
use crate::state::AppState;

/// Most audit events one request returns.
const MAX_EVENTS: u32 = 10_000;
/// Audit events returned without `limit`.
const DEFAULT_EVENTS: u32 = 1_000;

/// Change a running sandbox's network policy. New connections follow it at once; `none` also cuts open tunnels.
#[utoipa::path(
    put, path = "/v1/sandboxes/{id}/network", tag = "network",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = NetworkPolicyBody,
    responses(
        (status = 200, description = "The policy now in force", body = NetworkPolicyBody),
        (status = 400, description = "Malformed JSON, or a bad host pattern or port (named in the message)", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox for this tenant", body = ErrorBody),
        (status = 409, description = "The sandbox has ended, or a process inside it holds the proxy's port 3128", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn set_network(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
    JsonBody(body): JsonBody<NetworkPolicyBody>,
) -> Result<Json<NetworkPolicyBody>, ApiError> {
    let policy: NetworkPolicy = body.into();
    change_policy(&state, &tenant, &id, policy.clone()).await?;
    Ok(Json(policy.into()))
}

/// Puts `policy` in force for the tenant's running sandbox `id` (the proxy at once, then the record): this route's
/// work, and the E2B facade's `update_network`.
pub(crate) async fn change_policy(
    state: &AppState,
    tenant: &Tenant,
    id: &str,
    policy: NetworkPolicy,
) -> Result<(), ApiError> {
    let compiled = egress::compile(&policy).map_err(ApiError::bad_request)?;
    let rules = egress::Rules::load(state.store(), &tenant.name, &policy.headers, &compiled).await?;
    running_sandbox(state, tenant, id).await?;
    state.egress().check_rule_hosts(id, &rules)?.map_err(ApiError::conflict)?;
    state.egress().set_policy(state.runtime(), id, compiled)?;
    state.egress().set_rules(id, rules)?;
    let mode = policy.mode;
    if !state.store().set_network_policy(&tenant.name, id, policy).await? {
        return Err(ApiError::conflict(format!("sandbox {id} ended while its policy was changed")));
    }
    tracing::info!(sandbox = %id, tenant = %tenant.name, ?mode, "network policy changed");
    Ok(())
}

/// The sandbox's egress audit: every connection attempt through the proxy with its decision, oldest first.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/egress", tag = "network",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("limit" = Option<u32>, Query, description = "Newest events to return (1 to 10000, default 1000)"),
    ),
    responses(
        (status = 200, description = "The audit trail (of ended sandboxes too)", body = EgressLog),
        (status = 400, description = "Bad limit", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox for this tenant", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn audit(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
    QueryParams(query): QueryParams<Vec<(String, String)>>,
) -> Result<Json<EgressLog>, ApiError> {
    let mut limit = DEFAULT_EVENTS;
    for (key, value) in query {
        match key.as_str() {
            "limit" => {
                limit = value.parse().ok().filter(|n| (1..=MAX_EVENTS).contains(n)).ok_or_else(|| {
                    ApiError::bad_request(format!("limit={value:?} must be a number from 1 to {MAX_EVENTS}"))
                })?
            }
            other => return Err(ApiError::bad_request(format!("unknown query parameter {other:?}: only limit"))),
        }
    }
    own_sandbox(&state, &tenant, &id).await?;
    let events = state.store().egress_events(&id, limit).await?;
    Ok(Json(EgressLog { sandbox_id: id, events }))
}
