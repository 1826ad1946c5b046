//! `GET /v1/config` (admin tenants only): the effective config, every default filled in, so an operator reviews the
//! policy the server applies (limits, tiers, pools, egress, scan policies, quotas, retention, stores) without reading
//! code. Its shape is the config file's (`docs/config.schema.json`); API keys and S3 credentials are written as
//! `"<redacted>"` by the config types themselves, and no key material is in the config at all.

use axum::Json;
use axum::extract::State;
use sandkasten_types::{Limits, Tier};
use serde::Serialize;
use utoipa::ToSchema;

use crate::api::error::{ApiError, ErrorBody};
use crate::api::isolation::IsolationName;
use crate::api::schemas::LimitsBody;
use crate::auth::Tenant;
use crate::config::ServerConfig;
use crate::state::AppState;

/// `GET /v1/config`: the policy the server applies.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ConfigBody {
    /// The effective config: the config file's keys and shape (its JSON schema is `docs/config.schema.json`), plus
    /// the tenants of `SANDKASTEN_API_KEYS`, with every default filled in (pool names and tiers, each tenant's scan
    /// policy, the pids cap, the snapshot store). API keys appear as `"<redacted>"`, one per key, and S3
    /// credentials as `"<redacted>"`.
    #[schema(value_type = Object)]
    pub config: ServerConfig,
    /// The limits of a sandbox whose create names none (each omitted field of a create's `limits` takes its value
    /// from here).
    pub default_limits: LimitsBody,
    /// Every isolation tier and whether it runs on this host.
    pub tiers: Vec<TierStatus>,
}

/// Whether one isolation tier runs here.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TierStatus {
    /// The tier.
    #[schema(value_type = IsolationName)]
    pub tier: Tier,
    /// Whether sandboxes of this tier can be created here.
    pub available: bool,
    /// Why not, when it is not available.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The effective config (admin tenants only).
#[utoipa::path(
    get, path = "/v1/config", tag = "service",
    responses(
        (status = 200, description = "The config the server applies, defaults filled in, secrets redacted", body = ConfigBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "The tenant is not an admin", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn get(State(state): State<AppState>, tenant: Tenant) -> Result<Json<ConfigBody>, ApiError> {
    if !tenant.admin {
        return Err(ApiError::forbidden(format!(
            "tenant {:?} may not read the server's config: it holds every tenant's quotas and policies; only a \
             tenant with admin = true in the server's config may",
            tenant.name
        )));
    }
    let tiers = Tier::ALL
        .into_iter()
        .map(|tier| {
            let reason = state.runtime().tier_unavailable(tier);
            TierStatus { tier, available: reason.is_none(), reason }
        })
        .collect();
    let config = state.effective_config().clone();
    Ok(Json(ConfigBody { config, default_limits: Limits::default().into(), tiers }))
}
