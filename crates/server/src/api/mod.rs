//! The HTTP API: the router and the layers every request passes (one log line per request, errors metric,
//! authentication on `/v1`); its OpenAPI description is `openapi`'s.

mod archive;
mod authenticate;
pub(crate) mod code;
pub mod code_schemas;
pub mod command_schemas;
mod command_stream;
pub(crate) mod commands;
pub mod config;
pub(crate) mod contexts;
pub(crate) mod egress;
pub mod egress_schemas;
pub mod error;
pub(crate) mod exec;
pub(crate) mod extract;
pub(crate) mod files;
mod fork;
pub mod isolation;
mod openapi;
mod output;
mod pause;
pub mod pools;
mod ports;
pub(crate) mod request_log;
mod run;
pub(crate) mod running;
pub(crate) mod sandboxes;
pub mod scan;
pub mod schemas;
mod secrets;
mod service;
mod snapshots;
mod template_build;
pub mod templates;
pub(crate) mod usage;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{any, get, post};

use crate::api::error::ErrorTag;
use crate::state::AppState;

pub use openapi::{ApiDoc, openapi_json};

/// Counts error responses by code.
async fn count_errors(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    if let Some(ErrorTag(code)) = response.extensions().get::<ErrorTag>() {
        state.metrics().error(code);
    }
    response
}

/// The whole HTTP API over `state`.
pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/sandboxes", post(sandboxes::create).get(sandboxes::list))
        .route("/sandboxes/{id}", get(sandboxes::get).delete(sandboxes::delete))
        .route("/sandboxes/{id}/timeout", post(sandboxes::set_timeout))
        .route("/sandboxes/{id}/pause", post(pause::pause))
        .route("/sandboxes/{id}/fork", post(fork::fork))
        .route("/sandboxes/{id}/snapshots", post(snapshots::create))
        .route("/snapshots", get(snapshots::list))
        .route("/snapshots/{id}", get(snapshots::get).delete(snapshots::delete))
        .route("/sandboxes/{id}/resume", post(pause::resume))
        .route("/sandboxes/{id}/metrics", get(usage::metrics))
        .route("/sandboxes/{id}/exec", post(exec::exec))
        .route("/sandboxes/{id}/commands", get(commands::list))
        .route("/sandboxes/{id}/commands/{command_id}", axum::routing::delete(commands::kill))
        .route("/sandboxes/{id}/commands/{command_id}/stream", get(command_stream::stream))
        .route("/sandboxes/{id}/commands/{command_id}/stdin", post(commands::stdin))
        .route("/sandboxes/{id}/commands/{command_id}/signal", post(commands::signal))
        .route("/sandboxes/{id}/commands/{command_id}/resize", post(commands::resize))
        .route("/sandboxes/{id}/code", post(code::run_code))
        .route("/sandboxes/{id}/contexts", post(contexts::create).get(contexts::list))
        .route("/sandboxes/{id}/contexts/{context_id}", axum::routing::delete(contexts::delete))
        .route("/sandboxes/{id}/contexts/{context_id}/restart", post(contexts::restart))
        .route("/sandboxes/{id}/files", get(files::read).put(files::write).delete(files::remove))
        .route("/sandboxes/{id}/files/list", get(files::list))
        .route("/sandboxes/{id}/files/stat", get(files::stat))
        .route("/sandboxes/{id}/files/mkdir", post(files::mkdir))
        .route("/sandboxes/{id}/files/rename", post(files::rename))
        .route("/sandboxes/{id}/files/archive", get(archive::download).put(archive::upload))
        .route("/sandboxes/{id}/ports/{port}", any(ports::forward_root))
        .route("/sandboxes/{id}/ports/{port}/", any(ports::forward_root))
        .route("/sandboxes/{id}/ports/{port}/{*path}", any(ports::forward_path))
        .route("/sandboxes/{id}/network", axum::routing::put(egress::set_network))
        .route("/sandboxes/{id}/egress", get(egress::audit))
        .route("/secrets", get(secrets::list))
        .route("/secrets/{name}", get(secrets::get).put(secrets::put).delete(secrets::delete))
        .route("/run", post(run::run))
        .route("/scan", post(scan::scan_code))
        .route("/pools", get(pools::list))
        .route("/pools/{name}", axum::routing::put(pools::resize))
        .route("/templates", get(templates::list).post(template_build::build))
        .route("/templates/{name}", axum::routing::delete(templates::delete))
        .route("/config", get(config::get))
        .route_layer(middleware::from_fn_with_state(state.clone(), authenticate::require_tenant));
    let metrics = match state.settings().metrics_require_auth {
        true => get(service::metrics)
            .route_layer(middleware::from_fn_with_state(state.clone(), authenticate::require_tenant)),
        false => get(service::metrics),
    };
    Router::new()
        .route("/healthz", get(service::healthz))
        .route("/metrics", metrics)
        .route("/openapi.json", get(openapi::openapi))
        .nest("/v1", v1)
        .merge(crate::e2b::routes(&state))
        .merge(crate::mcp::routes(&state))
        .fallback(error::route_not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), crate::e2b::route_by_host))
        .layer(middleware::from_fn_with_state(state.clone(), count_errors))
        .layer(middleware::from_fn(request_log::log_request))
        .with_state(state)
}
