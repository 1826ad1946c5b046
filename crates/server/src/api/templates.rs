//! Template routes on the server's template cache (`[templates] cache`, what `{"template": NAME}` names):
//! `GET /v1/templates` lists the built templates (any tenant: they are what creates may name), `DELETE
//! /v1/templates/{name}` removes one (admin tenants only: templates are operator-wide; not one a pool names) and then
//! every layer that no template uses, no sandbox of this server (running or paused), memory snapshot or pool reads
//! and no sandbox record on this host names (creates between choosing a template and recording their sandbox finish
//! first). Builds run on the host (`sandkasten template build --cache DIR`) or through `POST /v1/templates`
//! (`template_build.rs`).

use std::collections::HashSet;
use std::path::PathBuf;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use sandkasten_template::{CacheError, TemplateCache, TemplateRecord};
use serde::Serialize;
use utoipa::ToSchema;

use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::IdPath;
use crate::auth::Tenant;
use crate::state::AppState;

/// A built template.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TemplateBody {
    /// The name `{"template": NAME}` takes.
    pub name: String,
    /// `sha256:` of its layers, in order: a rebuild with the same result has the same digest.
    pub digest: String,
    /// What it was built on (`host`).
    pub base: String,
    /// How many layers it has.
    pub layers: usize,
    /// Its layers' size on disk, bytes.
    pub size_bytes: u64,
    /// When it was built, seconds since the Unix epoch.
    pub created: u64,
    /// The working directory of its commands, when not the home.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// Its name for the sandbox user (uid 1000).
    pub user: String,
    /// The modules a warm pool's zygote of the template imports ahead of time.
    pub preload: Vec<String>,
}

impl From<TemplateRecord> for TemplateBody {
    fn from(record: TemplateRecord) -> Self {
        TemplateBody {
            name: record.name,
            digest: record.digest,
            base: record.base,
            layers: record.layers.len(),
            size_bytes: record.size_bytes,
            created: record.created,
            workdir: record.workdir,
            user: record.user,
            preload: record.preload,
        }
    }
}

/// `GET /v1/templates`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TemplateList {
    /// Every built template, by name.
    pub templates: Vec<TemplateBody>,
}

/// The server's template cache, or `None` when nothing was built into it yet.
fn open_cache(state: &AppState) -> Result<Option<TemplateCache>, ApiError> {
    let root = state.effective_config().templates.cache_root();
    if !root.is_dir() {
        return Ok(None);
    }
    TemplateCache::open(&root).map(Some).map_err(ApiError::internal)
}

/// List the templates built on this server.
#[utoipa::path(
    get, path = "/v1/templates", tag = "templates",
    responses(
        (status = 200, description = "Every template built into the server's template cache", body = TemplateList),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn list(State(state): State<AppState>, _tenant: Tenant) -> Result<Json<TemplateList>, ApiError> {
    let templates = tokio::task::spawn_blocking(move || match open_cache(&state)? {
        Some(cache) => cache.templates().map_err(ApiError::internal),
        None => Ok(Vec::new()),
    })
    .await
    .map_err(ApiError::internal)??;
    Ok(Json(TemplateList { templates: templates.into_iter().map(TemplateBody::from).collect() }))
}

/// The template layers this server still needs: its sandboxes' (running or paused), its memory snapshots' (their
/// restore mounts those very layers), its pools' (members yet to be made). The runtime records of this host add the
/// rest.
async fn layers_held(state: &AppState) -> Result<HashSet<PathBuf>, ApiError> {
    let sandboxes = state.store().running_sandboxes().await.map_err(ApiError::internal)?;
    let mut held: HashSet<PathBuf> = sandboxes.into_iter().flat_map(|record| record.spec.layers.layers).collect();
    held.extend(state.store().snapshot_layers().await.map_err(ApiError::internal)?);
    held.extend(state.pools().template_layers());
    Ok(held)
}

/// Remove a built template (admin tenants only), then every layer nothing uses any more. Its sandboxes (running or
/// paused), memory snapshots and pools keep theirs: those layers stay until nothing names them and a later removal (or
/// `sandkasten template gc`) collects them.
#[utoipa::path(
    delete, path = "/v1/templates/{name}", tag = "templates",
    params(("name" = String, Path, description = "The template's name")),
    responses(
        (status = 204, description = "Removed"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "The tenant is not an admin", body = ErrorBody),
        (status = 404, description = "No template of that name", body = ErrorBody),
        (status = 409, description = "A build or pull holds the template cache (try again when it finished), or a \
            pool of the server's config names the template", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn delete(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(name): IdPath,
) -> Result<StatusCode, ApiError> {
    if !tenant.admin {
        return Err(ApiError::forbidden(format!(
            "tenant {:?} may not remove templates: they are shared by all tenants; only a tenant with admin = true \
             in the server's config may",
            tenant.name
        )));
    }
    if let Some(pool) = state.pools().pool_of_template(&name) {
        return Err(ApiError::conflict(format!(
            "template {name:?} is the template of pool {pool:?} (a [[pools]] table of the server's config), which a \
             server start would refuse without it: remove the pool from the config and restart first"
        )));
    }
    // No create is between choosing a template and recording its sandbox while this holds; it moves into the
    // removal's thread, so a client that goes away does not release it before the removal ends.
    let removing_templates = state.removing_templates().await;
    // The starting layers before the rows: a create only moves from starting to recorded, so in this order none is
    // in neither.
    let mut in_use = removing_templates.starting_layers();
    in_use.extend(layers_held(&state).await?);
    let unknown = || ApiError::not_found(format!("no template named {name:?}; GET /v1/templates lists them"));
    let removing = name.clone();
    let report = tokio::task::spawn_blocking(move || {
        let _removing_templates = removing_templates;
        in_use.extend(sandkasten_runtime::records::layers_in_use(
            &sandkasten_runtime::RuntimeConfig::default().records_dir(),
        ));
        let Some(cache) = open_cache(&state)? else { return Ok(None) };
        let Some(_lock) = cache.try_lock().map_err(ApiError::internal)? else {
            return Err(ApiError::conflict(
                "a template build or pull holds the template cache: try again when it finished".to_owned(),
            ));
        };
        match cache.remove_template(&removing, &in_use) {
            Ok(report) => Ok(Some(report)),
            Err(CacheError::UnknownTemplate(_)) => Ok(None),
            Err(error) => Err(ApiError::internal(error)),
        }
    })
    .await
    .map_err(ApiError::internal)??
    .ok_or_else(unknown)?;
    tracing::info!(template = %name, tenant = %tenant.name, removed = report.layers_removed,
        kept_in_use = report.layers_in_use, "template removed");
    Ok(StatusCode::NO_CONTENT)
}
