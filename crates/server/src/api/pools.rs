//! Warm pool routes: `GET /v1/pools` shows every pool's sizes and counts (any tenant: it tells a client which
//! isolation tier, template and limits a pool serves), `PUT /v1/pools/{name}` resizes one (admin tenants only: pools are
//! operator-wide). A resize lasts until the server restarts.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{IdPath, JsonBody};
use crate::api::isolation::IsolationName;
use crate::api::schemas::LimitsBody;
use crate::auth::Tenant;
use crate::config::{MAX_POOL_SIZE, ZygoteKind};
use crate::lifecycle::refill;
use crate::pool::PoolStatus;
use crate::state::AppState;
use sandkasten_types::Tier;

/// A warm pool: which sandboxes it holds and how full it is.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PoolBody {
    /// Name (the `class` label of the `pool_*` metrics).
    pub name: String,
    /// Isolation tier of its sandboxes: only creates and runs that resolve to this tier take one of them.
    #[schema(value_type = IsolationName)]
    pub isolation: Tier,
    /// Template of its sandboxes: `host`, `e2b` or a template built on the server.
    pub template: String,
    /// Limits of its sandboxes: a create or run with exactly these limits (and no env) takes one of them.
    pub limits: LimitsBody,
    /// The interpreter waiting in each member (`python` or `node`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zygote: Option<String>,
    /// Ready sandboxes kept at least.
    pub min: u64,
    /// Most sandboxes held, ready or being created.
    pub max: u64,
    /// Ready sandboxes it refills to now: `min`, plus one per recent miss, at most `max`.
    pub target: u64,
    /// Ready sandboxes now.
    pub ready: u64,
    /// Sandboxes being created now.
    pub creating: u64,
    /// Creates and runs it served since the server started.
    pub hits: u64,
    /// Creates and runs of its class that found it empty since the server started.
    pub misses: u64,
}

/// `GET /v1/pools`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PoolList {
    /// Every configured pool, in config order.
    pub pools: Vec<PoolBody>,
}

/// `PUT /v1/pools/{name}`: the new sizes.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolSizes {
    /// Ready sandboxes to keep (0 keeps none: the pool then only grows on misses).
    pub min: u64,
    /// Most sandboxes to hold, ready or being created (at most 1024); ready ones past it are destroyed.
    pub max: u64,
}

fn zygote_name(kind: ZygoteKind) -> &'static str {
    match kind {
        ZygoteKind::Python => "python",
        ZygoteKind::Node => "node",
    }
}

fn as_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

impl From<PoolStatus> for PoolBody {
    fn from(status: PoolStatus) -> Self {
        let numbers = status.numbers;
        PoolBody {
            name: status.name,
            isolation: status.spec.tier(),
            template: crate::built_templates::name_of(&status.spec),
            limits: status.spec.limits.into(),
            zygote: status.zygote.map(|kind| zygote_name(kind).to_owned()),
            min: as_u64(numbers.min),
            max: as_u64(numbers.max),
            target: as_u64(numbers.target),
            ready: as_u64(numbers.ready),
            creating: as_u64(numbers.creating),
            hits: numbers.hits,
            misses: numbers.misses,
        }
    }
}

/// The sizes as `usize`, or a 400 naming the field that is out of range.
fn checked(sizes: &PoolSizes) -> Result<(usize, usize), ApiError> {
    let cap = as_u64(MAX_POOL_SIZE);
    if sizes.max > cap {
        return Err(ApiError::bad_request(format!("max is {}; a pool holds at most {cap} sandboxes", sizes.max)));
    }
    if sizes.min > sizes.max {
        return Err(ApiError::bad_request(format!("min ({}) must not exceed max ({})", sizes.min, sizes.max)));
    }
    // Both are at most MAX_POOL_SIZE, so they fit.
    Ok((usize::try_from(sizes.min).unwrap_or(0), usize::try_from(sizes.max).unwrap_or(0)))
}

/// List the warm pools.
#[utoipa::path(
    get, path = "/v1/pools", tag = "pools",
    responses(
        (status = 200, description = "Every warm pool with its sizes and counts", body = PoolList),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn list(State(state): State<AppState>, _tenant: Tenant) -> Json<PoolList> {
    Json(PoolList { pools: state.pools().status().into_iter().map(PoolBody::from).collect() })
}

/// Resize a warm pool (admin tenants only). A higher `min` is refilled in the background; ready sandboxes past a
/// lower `max` are destroyed before the answer.
#[utoipa::path(
    put, path = "/v1/pools/{name}", tag = "pools",
    params(("name" = String, Path, description = "The pool's name")),
    request_body = PoolSizes,
    responses(
        (status = 200, description = "The pool with its new sizes", body = PoolBody),
        (status = 400, description = "Malformed JSON, or min > max, or max above 1024", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "The tenant is not an admin", body = ErrorBody),
        (status = 404, description = "No pool of that name", body = ErrorBody),
        (status = 422, description = "min or max missing or not a non-negative integer", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn resize(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(name): IdPath,
    JsonBody(sizes): JsonBody<PoolSizes>,
) -> Result<Json<PoolBody>, ApiError> {
    if !tenant.admin {
        return Err(ApiError::forbidden(format!(
            "tenant {:?} may not resize pools: pools are shared by all tenants; only a tenant with admin = true in \
             the server's config may",
            tenant.name
        )));
    }
    let (min, max) = checked(&sizes)?;
    let (status, destroyed) = refill::resize(&state, &name, min, max)
        .await
        .ok_or_else(|| ApiError::not_found(format!("no pool named {name:?}; GET /v1/pools lists them")))?;
    tracing::info!(pool = %name, tenant = %tenant.name, min, max, destroyed, "pool resized");
    Ok(Json(PoolBody::from(status)))
}
