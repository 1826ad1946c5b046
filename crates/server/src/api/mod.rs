//! The HTTP API: the router, its OpenAPI description, and the layers every request passes (one log line per
//! request, errors metric, authentication on `/v1`).

mod archive;
pub(crate) mod code;
pub mod code_schemas;
pub mod command_schemas;
mod command_stream;
pub(crate) mod commands;
pub(crate) mod contexts;
mod egress;
pub mod egress_schemas;
pub mod error;
mod exec;
pub(crate) mod extract;
mod files;
pub mod isolation;
mod output;
pub mod pools;
mod request_log;
mod run;
pub(crate) mod running;
pub(crate) mod sandboxes;
pub mod schemas;
mod secrets;
mod service;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::api::error::ErrorTag;
use crate::auth::require_tenant;
use crate::state::AppState;

pub(crate) use request_log::LoggedTenant;

/// The OpenAPI description of every route.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "sandkasten",
        description = "Long-lived sandboxes for untrusted code: lifecycle, exec (JSON or SSE), files. \
            Each sandbox runs on one isolation tier (`isolation`: `process`, namespaces and seccomp around code that \
            shares the host kernel; `gvisor`, a user-space kernel between the code and the host; see IsolationName), \
            the server's default unless the create names one. \
            Authenticate with `Authorization: Bearer KEY`; errors are `{\"error\": {\"code\", \"message\"}}`.",
        license(name = "Apache-2.0"),
    ),
    paths(
        sandboxes::create, sandboxes::list, sandboxes::get, sandboxes::delete, sandboxes::set_timeout,
        exec::exec,
        commands::list, command_stream::stream, commands::stdin, commands::signal, commands::kill,
        code::run_code, contexts::create, contexts::list, contexts::delete, contexts::restart,
        run::run,
        egress::set_network, egress::audit, secrets::put, secrets::list, secrets::delete,
        pools::list, pools::resize,
        files::read, files::write, files::remove, files::list, files::stat, files::mkdir, files::rename,
        archive::upload, archive::download,
        service::healthz, service::metrics, service::openapi,
    ),
    components(schemas(
        error::ErrorBody, error::ErrorDetail, error::ErrorCode, isolation::IsolationName,
        schemas::OutputEvent, schemas::ExitEvent,
        code_schemas::CellResultBody, code_schemas::CellErrorBody, code_schemas::CodeResponse,
        run::RunExitEvent, run::RunPhases,
        command_schemas::CommandStateName,
        egress_schemas::NetworkModeName, crate::egress::store::EgressEvent,
        pools::PoolBody, pools::PoolList, pools::PoolSizes,
    )),
    modifiers(&BearerAuth),
    tags(
        (name = "sandboxes", description = "Create, find and destroy sandboxes"),
        (name = "exec", description = "Run commands"),
        (name = "code", description = "Stateful code interpreter: Python and JavaScript contexts"),
        (name = "files", description = "Files inside a sandbox"),
        (name = "network", description = "Egress: network policy, audit, secrets"),
        (name = "pools", description = "Warm pools: sizes and counts; resizing is for admin tenants"),
        (name = "service", description = "Health, metrics, this description"),
    )
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme("api_key", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
    }
}

/// The OpenAPI description as pretty JSON with a trailing newline (what `docs/api/openapi.json` holds).
pub fn openapi_json() -> String {
    let mut text = ApiDoc::openapi().to_pretty_json().unwrap_or_else(|error| {
        tracing::error!(%error, "openapi description cannot be serialised");
        String::from("{}")
    });
    text.push('\n');
    text
}

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
        .route("/sandboxes/{id}/exec", post(exec::exec))
        .route("/sandboxes/{id}/commands", get(commands::list))
        .route("/sandboxes/{id}/commands/{command_id}", axum::routing::delete(commands::kill))
        .route("/sandboxes/{id}/commands/{command_id}/stream", get(command_stream::stream))
        .route("/sandboxes/{id}/commands/{command_id}/stdin", post(commands::stdin))
        .route("/sandboxes/{id}/commands/{command_id}/signal", post(commands::signal))
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
        .route("/sandboxes/{id}/network", axum::routing::put(egress::set_network))
        .route("/sandboxes/{id}/egress", get(egress::audit))
        .route("/secrets", get(secrets::list))
        .route("/secrets/{name}", axum::routing::put(secrets::put).delete(secrets::delete))
        .route("/run", post(run::run))
        .route("/pools", get(pools::list))
        .route("/pools/{name}", axum::routing::put(pools::resize))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_tenant));
    Router::new()
        .route("/healthz", get(service::healthz))
        .route("/metrics", get(service::metrics))
        .route("/openapi.json", get(service::openapi))
        .nest("/v1", v1)
        .merge(crate::e2b::routes(&state))
        .fallback(error::route_not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), count_errors))
        .layer(middleware::from_fn(request_log::log_request))
        .with_state(state)
}
