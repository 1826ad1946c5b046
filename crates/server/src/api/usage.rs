//! `GET /v1/sandboxes/{id}/metrics`: what a sandbox used over time (CPU share, memory held, disk fill), from the
//! server's usage samples plus a reading taken now when the sandbox runs.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{IdPath, QueryParams, own_sandbox};
use crate::auth::Tenant;
use crate::state::AppState;
use crate::store::{SandboxRecord, SandboxState};
use crate::usage_sampler;
use crate::usage_samples::UsageSample;

/// `?from_ms=&to_ms=`: the samples wanted (both ends included; default all that are kept).
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct MetricsQuery {
    /// Earliest sample, ms since the Unix epoch.
    pub from_ms: Option<i64>,
    /// Latest sample, ms since the Unix epoch.
    pub to_ms: Option<i64>,
}

/// A sandbox's usage samples, oldest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SandboxMetrics {
    /// The sandbox.
    pub sandbox_id: String,
    /// Its CPU allowance (`limits.cpus`): `cpu_used_pct` is a share of it.
    pub cpus: f64,
    /// Its memory limit (`limits.memory_bytes`), in bytes.
    pub memory_limit_bytes: u64,
    /// Samples taken every `[metrics] sample_interval_s` while it runs, and one at this request; kept while it is
    /// paused (none are taken then), gone once it ended.
    pub samples: Vec<UsageSample>,
}

/// What a sandbox used over time.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/metrics", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id"), MetricsQuery),
    responses(
        (status = 200, description = "Its samples, oldest first", body = SandboxMetrics),
        (status = 400, description = "Bad query (from_ms after to_ms)", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox for this tenant", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn metrics(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
    QueryParams(query): QueryParams<MetricsQuery>,
) -> Result<Json<SandboxMetrics>, ApiError> {
    let (from_ms, to_ms) = (query.from_ms.unwrap_or(i64::MIN), query.to_ms.unwrap_or(i64::MAX));
    if from_ms > to_ms {
        return Err(ApiError::bad_request(format!(
            "from_ms ({from_ms}) is after to_ms ({to_ms}): ask for a range that starts before it ends"
        )));
    }
    let record = own_sandbox(&state, &tenant, &id).await?;
    Ok(Json(sandbox_metrics(&state, &record, from_ms, to_ms).await))
}

/// `record`'s samples in `from_ms..=to_ms`, after a reading taken now when it runs (shared with the E2B facade).
pub(crate) async fn sandbox_metrics(
    state: &AppState,
    record: &SandboxRecord,
    from_ms: i64,
    to_ms: i64,
) -> SandboxMetrics {
    if record.state == SandboxState::Running {
        usage_sampler::sample(state, record, false).await;
    }
    SandboxMetrics {
        sandbox_id: record.id.clone(),
        cpus: record.spec.limits.cpus,
        memory_limit_bytes: record.spec.limits.memory_bytes,
        samples: state.usage_samples().between(&record.id, from_ms, to_ms),
    }
}
