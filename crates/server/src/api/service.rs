//! Routes outside `/v1` that need no API key: health and Prometheus metrics (unless `[metrics] require_auth`; the
//! OpenAPI description is `openapi`'s). Every metric is named `sandkasten_*`, so it cannot collide with another
//! exporter's on a shared Prometheus.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};

use crate::api::error::{ApiError, ErrorBody};
use crate::api::schemas::Health;
use crate::state::AppState;

/// Health: 200 while every part of the server works; 503 with the reason while one does not (the spawner died and is
/// being restarted).
#[utoipa::path(
    get, path = "/healthz", tag = "service",
    responses(
        (status = 200, description = "The server and its parts work", body = Health),
        (status = 503, description = "A part failed: `reason` says which and what happens now", body = Health),
    )
)]
pub(crate) async fn healthz(State(state): State<AppState>) -> Response {
    match state.runtime().unhealthy() {
        None => Json(Health { status: "ok".into(), reason: None }).into_response(),
        Some(reason) => {
            let body = Health { status: "unavailable".into(), reason: Some(reason) };
            (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
        }
    }
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
