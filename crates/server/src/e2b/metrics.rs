//! `GET /sandboxes/{id}/metrics` (the SDK's `get_metrics()`): the sandbox's usage samples in E2B's shape. E2B's
//! `cpuCount` is the sandbox's CPU allowance rounded up, `cpuUsedPct` a share of it, `memTotal` its memory limit,
//! `memUsed` what it holds besides file cache (`memCache`), `disk*` its writable filesystems.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};

use crate::api::usage::sandbox_metrics;
use crate::clock::rfc3339;
use crate::e2b::auth::api_tenant;
use crate::e2b::error::E2bError;
use crate::e2b::lookup::live;
use crate::state::AppState;

/// `?start=&end=`, in seconds since the Unix epoch (the SDK's `start`/`end` datetimes).
#[derive(Debug, Deserialize)]
pub(crate) struct MetricsQuery {
    start: Option<i64>,
    end: Option<i64>,
}

/// One of E2B's `SandboxMetric` entries.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SandboxMetric {
    timestamp: String,
    timestamp_unix: i64,
    cpu_count: u64,
    cpu_used_pct: f64,
    mem_used: u64,
    mem_total: u64,
    mem_cache: u64,
    disk_used: u64,
    disk_total: u64,
}

/// The caller's running or paused sandbox's samples between `start` and `end` (404 for anyone else's).
pub(crate) async fn metrics(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<Query<MetricsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<SandboxMetric>>, E2bError> {
    let tenant = api_tenant(&state, &headers)?;
    let Query(query) = query.map_err(|rejection| E2bError::invalid(rejection.body_text()))?;
    let record = live(&state, &tenant, &id).await?;
    let from_ms = query.start.map_or(i64::MIN, |s| s.saturating_mul(1000));
    let to_ms = query.end.map_or(i64::MAX, |s| s.saturating_mul(1000).saturating_add(999));
    if from_ms > to_ms {
        return Err(E2bError::invalid(format!("start ({:?}) is after end ({:?})", query.start, query.end)));
    }
    let found = sandbox_metrics(&state, &record, from_ms, to_ms).await;
    let cpu_count = found.cpus.ceil().max(1.0) as u64;
    let entries = found
        .samples
        .into_iter()
        .map(|sample| SandboxMetric {
            timestamp: rfc3339(sample.timestamp_ms),
            timestamp_unix: sample.timestamp_ms.div_euclid(1000),
            cpu_count,
            cpu_used_pct: sample.cpu_used_pct,
            mem_used: sample.memory_used_bytes,
            mem_total: found.memory_limit_bytes,
            mem_cache: sample.memory_cache_bytes,
            disk_used: sample.disk_used_bytes,
            disk_total: sample.disk_total_bytes,
        })
        .collect();
    Ok(Json(entries))
}
