//! The E2B-compatible facade: the unmodified `e2b` and `e2b-code-interpreter` SDKs work against `sandkasten serve`
//! with `E2B_API_URL` and `E2B_SANDBOX_URL` set to the server's URL and `E2B_API_KEY` to a tenant key. The SDK
//! sends every per-sandbox request to `E2B_SANDBOX_URL` and names the sandbox in `E2b-Sandbox-Id`, so the facade
//! serves everything at the root of the one listener: its paths (`/v2/sandboxes`, `/sandboxes/…`, `/files`,
//! `/secrets`, `/snapshots`, `/templates/…`, `/health`, `/process.Process/…`, `/filesystem.Filesystem/…`, `/execute`,
//! `/contexts`) do not meet the native API's (`/v1/…`, `/healthz`, `/metrics`, `/openapi.json`). Everything goes
//! through the same runtime, store, quotas, snapshot store and expiry as the native API. Facade sandboxes use the
//! `e2b` template (user `user`, home `/home/user`). A request whose `Host` is a sandbox's port name
//! (`PORT-SANDBOXID.DOMAIN`, the SDK's `get_host`) goes to that port instead (`ports`, a layer in front of every
//! route). See docs/e2b-compat.md for what is supported.

mod auth;
mod connect;
mod control;
mod entries;
mod error;
mod files;
mod filesystem;
mod fork;
mod interpreter;
mod languages;
mod listing;
mod lookup;
mod metrics;
mod network;
mod paging;
mod paths;
mod ports;
mod process;
mod secrets;
pub(crate) mod sessions;
mod signing;
mod snapshots;
mod watch;
mod watchers;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{delete, get, post, put};

use crate::state::AppState;

pub(crate) use ports::route_by_host;

/// The facade's routes.
pub(crate) fn routes(state: &AppState) -> Router<AppState> {
    let max_upload = usize::try_from(state.settings().max_file_bytes).unwrap_or(usize::MAX).saturating_add(1 << 20);
    Router::new()
        .route("/v2/sandboxes", post(control::create).get(listing::list))
        .route("/sandboxes", post(control::create))
        .route("/sandboxes/{id}", get(listing::info).delete(control::kill))
        .route("/sandboxes/{id}/timeout", post(control::set_timeout))
        .route("/sandboxes/{id}/connect", post(control::connect))
        .route("/v2/sandboxes/{id}/connect", post(control::connect))
        .route("/sandboxes/{id}/pause", post(control::pause))
        .route("/sandboxes/{id}/resume", post(control::resume))
        .route("/sandboxes/{id}/snapshots", post(snapshots::create))
        .route("/sandboxes/{id}/fork", post(fork::fork))
        .route("/sandboxes/{id}/refreshes", post(control::unsupported))
        .route("/sandboxes/{id}/metrics", get(metrics::metrics))
        .route("/sandboxes/{id}/logs", get(control::unsupported))
        .route("/v2/sandboxes/{id}/logs", get(control::unsupported))
        .route("/sandboxes/{id}/network", put(control::update_network))
        .route("/secrets", post(secrets::create).get(secrets::list))
        .route("/secrets/{id}", get(secrets::info).post(secrets::update).delete(secrets::destroy))
        .route("/snapshots", get(snapshots::list))
        .route("/templates/{id}", delete(snapshots::delete_template))
        .route("/health", get(files::health))
        .route("/files", get(files::download).post(files::upload).layer(DefaultBodyLimit::max(max_upload)))
        .route("/process.Process/{method}", post(process::call))
        .route("/filesystem.Filesystem/{method}", post(filesystem::call))
        .route("/execute", post(interpreter::execute))
        .route("/contexts", post(interpreter::create_context).get(interpreter::list_contexts))
        .route("/contexts/{id}", delete(interpreter::remove_context))
        .route("/contexts/{id}/restart", post(interpreter::restart_context))
}
