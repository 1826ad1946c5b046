//! The OpenAPI description of every route (`ApiDoc`, served at `/openapi.json` and kept in `docs/api/openapi.json`)
//! and the route that serves it.

use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::api::{
    archive, code, code_schemas, command_schemas, command_stream, commands, config, contexts, egress, egress_schemas,
    error, exec, files, fork, isolation, pause, pools, ports, run, sandboxes, scan, schemas, secrets, service,
    snapshots, template_build, templates, usage,
};

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
        pause::pause, pause::resume, fork::fork, usage::metrics,
        snapshots::create, snapshots::list, snapshots::get, snapshots::delete,
        exec::exec,
        commands::list, command_stream::stream, commands::stdin, commands::signal, commands::resize, commands::kill,
        code::run_code, contexts::create, contexts::list, contexts::delete, contexts::restart,
        run::run, scan::scan_code,
        egress::set_network, egress::audit, secrets::put, secrets::get, secrets::list, secrets::delete,
        pools::list, pools::resize, templates::list, templates::delete, template_build::build,
        files::read, files::write, files::remove, files::list, files::stat, files::mkdir, files::rename,
        archive::upload, archive::download, ports::forward_path,
        config::get, service::healthz, service::metrics, openapi,
    ),
    components(schemas(
        error::ErrorBody, error::ErrorDetail, error::ErrorCode, isolation::IsolationName,
        schemas::OutputEvent, schemas::ExitEvent,
        code_schemas::CellResultBody, code_schemas::CellErrorBody, code_schemas::CodeResponse,
        run::RunExitEvent,
        command_schemas::CommandStateName,
        egress_schemas::NetworkModeName, crate::egress::store::EgressEvent,
        pools::PoolBody, pools::PoolList, pools::PoolSizes, templates::TemplateBody, templates::TemplateList,
        template_build::BuildRequest, sandkasten_template_build::BuildEvent, sandkasten_template_build::FailedAt,
        sandkasten_template_build::FailedPhase,
        sandkasten_scan::Finding, sandkasten_scan::Severity, sandkasten_scan::Verdict,
    )),
    modifiers(&BearerAuth),
    tags(
        (name = "sandboxes", description = "Create, find and destroy sandboxes"),
        (name = "exec", description = "Run commands"),
        (name = "code", description = "Stateful code interpreter: Python and JavaScript contexts"),
        (name = "snapshots", description = "Snapshots of a sandbox's files, kept in the snapshot store; restore with \
            POST /v1/sandboxes {\"snapshot\": ID}"),
        (name = "files", description = "Files inside a sandbox"),
        (name = "network", description = "Egress: network policy, audit, secrets"),
        (name = "pools", description = "Warm pools: sizes and counts; resizing is for admin tenants"),
        (name = "templates", description = "Templates built on the server (`sandkasten template build --cache`): \
            list; removing is for admin tenants"),
        (name = "scan", description = "Static scan of code before it runs: findings, import validation, the \
            tenant's policy"),
        (name = "service", description = "Health, metrics, the effective config (admin tenants), this description"),
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

/// This API's OpenAPI 3.1 description.
#[utoipa::path(
    get, path = "/openapi.json", tag = "service",
    responses((status = 200, description = "The OpenAPI description", body = Object, content_type = "application/json"))
)]
pub(crate) async fn openapi() -> Response {
    ([(CONTENT_TYPE, "application/json")], openapi_json()).into_response()
}
