//! Routes outside `/v1` that need no API key: health and Prometheus metrics (unless `[metrics] require_auth`; the
//! OpenAPI description is `openapi`'s). Every metric is named `sandkasten_*`, so it cannot collide with another
//! exporter's on a shared Prometheus.

use axum::Json;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};

use crate::api::error::{ApiError, ErrorBody};
use crate::api::schemas::Health;
use crate::state::AppState;

/// Liveness: answers while the server runs.
#[utoipa::path(
    get, path = "/healthz", tag = "service",
    responses((status = 200, description = "The server is up", body = Health))
)]
pub(crate) async fn healthz() -> Json<Health> {
    Json(Health { status: "ok".into() })
}

/// Prometheus metrics (text exposition format).
#[utoipa::path(
    get, path = "/metrics", tag = "service",
    responses(
        (status = 200, description = "Metrics in the Prometheus text format", body = String, content_type = "text/plain"),
        (status = 500, description = "The store could not be read", body = ErrorBody),
    )
)]
pub(crate) async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let active = state.store().count_running().await?;
    let text = state.metrics().render(active);
    Ok(([(CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}
