//! Sandbox routes: create, list (with metadata filters, paged by `crate::listing`'s cursors), get, delete, and set the timeout (the work of each is
//! `lifecycle`'s).

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use sandkasten_types::{Limits, SandboxSpec};

use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{IdPath, JsonBody, QueryParams, own_sandbox, running_sandbox};
use crate::api::schemas::{CreateSandboxRequest, SandboxBody, SandboxList, TimeoutRequest};
use crate::api::snapshots::snapshot_for_create;
use crate::auth::Tenant;
use crate::lifecycle::{check_timeout, end_running, start_from_memory, start_on_files, start_sandbox};
use crate::listing::{Cursor, Order, page};
use crate::state::AppState;
use crate::store::SandboxState;
use crate::validate;

/// Create a sandbox.
#[utoipa::path(
    post, path = "/v1/sandboxes", tag = "sandboxes",
    request_body = CreateSandboxRequest,
    responses(
        (status = 201, description = "Created and running (with the snapshot's files, when one is named)",
            body = SandboxBody),
        (status = 400, description = "Malformed JSON, or a bad network pattern (named in the message)", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such snapshot for this tenant", body = ErrorBody),
        (status = 409, description = "The snapshot is still being saved, is damaged (the message says so; delete it), \
            or its files could not be unpacked (e.g. larger than the disk limit); nothing was created",
            body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 422, description = "Limits, env, metadata or timeout out of range, an unknown secret or a misspelt \
            isolation (`unprocessable`), or an isolation tier that cannot run here (`tier_unavailable`: not available \
            yet, or not installed on this host; the message says how to install it)", body = ErrorBody),
        (status = 429, description = "A tenant quota would be exceeded", body = ErrorBody),
        (status = 503, description = "The snapshot store failed (`store_failed`); nothing was created",
            body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn create(
    State(state): State<AppState>,
    tenant: Tenant,
    JsonBody(body): JsonBody<CreateSandboxRequest>,
) -> Result<(StatusCode, Json<SandboxBody>), ApiError> {
    let snapshot = match &body.snapshot {
        Some(id) => Some(snapshot_for_create(&state, &tenant, id).await?),
        None => None,
    };
    if let Some(snapshot) = snapshot.as_ref().filter(|snapshot| snapshot.memory).cloned() {
        // The processes go on where they were: the sandbox is the source's as it was.
        if body.isolation.is_some_and(|tier| Some(tier) != snapshot.spec.isolation)
            || body.limits.is_some()
            || body.template.is_some()
            || !body.env.is_empty()
            || body.network.is_some()
            || !body.secrets.is_empty()
        {
            return Err(ApiError::unprocessable(format!(
                "snapshot {} holds a running sandbox's memory: it restores with that sandbox's spec as it was; omit \
                 isolation, template, limits, env, network and secrets",
                snapshot.id
            )));
        }
        validate::metadata(&body.metadata).map_err(ApiError::unprocessable)?;
        let settings = state.settings();
        let expires_ms = check_timeout(settings, body.timeout_s.unwrap_or(settings.default_timeout_s))?;
        let current =
            start_from_memory(&state, &tenant, &snapshot, body.metadata, (expires_ms, body.lifecycle)).await?;
        return Ok((StatusCode::CREATED, Json(current.into())));
    }
    let (isolation, limits, template) = match &snapshot {
        Some(snapshot) => {
            let theirs = crate::built_templates::name_of(&snapshot.spec);
            if body.template.as_ref().is_some_and(|asked| *asked != theirs) {
                return Err(ApiError::unprocessable(format!(
                    "snapshot {} holds the files of a {theirs:?} template sandbox; omit template or ask for that one",
                    snapshot.id
                )));
            }
            let limits = body.limits.map_or_else(|| snapshot.spec.limits.clone(), Limits::from);
            (body.isolation.or(snapshot.spec.isolation), limits, Some(theirs))
        }
        None => (body.isolation, body.limits.unwrap_or_default().into(), body.template),
    };
    limits.validate().map_err(|error| ApiError::unprocessable(format!("limits: {error}")))?;
    validate::environment(&body.env).map_err(ApiError::unprocessable)?;
    validate::metadata(&body.metadata).map_err(ApiError::unprocessable)?;
    state.shared_templates().fetch(state.effective_config(), template.as_deref()).await?;
    // A template removal waits while the template is chosen, then keeps the layers chosen until the sandbox's row
    // names them (`template_use`): a restore from a snapshot, which can take minutes, holds off no removal.
    let choosing = state.choosing_template(template.as_deref()).await;
    let chosen = crate::built_templates::choose(&state.effective_config().templates, template.as_deref())?;
    let settings = state.settings();
    let expires_ms = check_timeout(settings, body.timeout_s.unwrap_or(settings.default_timeout_s))?;
    let mut spec = SandboxSpec {
        isolation,
        limits,
        env: body.env,
        network: body.network.unwrap_or_default().into(),
        secrets: body.secrets,
        workload: body.workload,
        ..SandboxSpec::default()
    };
    chosen.apply(&mut spec);
    let starting = choosing.map(|choosing| choosing.starting(&spec.layers.layers));
    let Some(snapshot) = snapshot else {
        let current = start_sandbox(&state, &tenant, spec, body.metadata, (expires_ms, body.lifecycle)).await?;
        drop(starting);
        return Ok((StatusCode::CREATED, Json(SandboxBody::created(current, state.runtime()))));
    };
    let expiry = (expires_ms, body.lifecycle);
    let current = start_on_files(&state, &tenant, spec, body.metadata, expiry, &snapshot, starting).await?;
    Ok((StatusCode::CREATED, Json(SandboxBody::created(current, state.runtime()))))
}

/// Largest `limit` of a native list page.
const MAX_LIST_LIMIT: usize = 1000;

/// Which sandboxes a list request wants, and which page of them.
struct ListFilter {
    state: Option<SandboxState>,
    metadata: BTreeMap<String, String>,
    /// Page size; `None`: every match in one answer.
    limit: Option<usize>,
    cursor: Option<Cursor>,
}

fn parse_list_query(pairs: Vec<(String, String)>) -> Result<ListFilter, ApiError> {
    let mut filter =
        ListFilter { state: Some(SandboxState::Running), metadata: BTreeMap::new(), limit: None, cursor: None };
    for (key, value) in pairs {
        if key == "state" {
            filter.state = match value.as_str() {
                "all" => None,
                name => Some(SandboxState::parse(name).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "state={name:?} is unknown: use running, paused, destroyed, lost, expired or all"
                    ))
                })?),
            };
        } else if key == "limit" {
            let limit = value.parse::<usize>().ok().filter(|limit| (1..=MAX_LIST_LIMIT).contains(limit));
            filter.limit = Some(limit.ok_or_else(|| {
                ApiError::bad_request(format!("limit={value:?} is not a page size: use 1 to {MAX_LIST_LIMIT}"))
            })?);
        } else if key == "cursor" {
            let cursor = Cursor::parse(&value, Order::Asc).map_err(|error| {
                ApiError::bad_request(format!("cursor={value:?}: {error} (next_cursor of the previous page)"))
            })?;
            filter.cursor = Some(cursor);
        } else if let Some(meta_key) = key.strip_prefix("metadata.") {
            validate::metadata_key(meta_key).map_err(ApiError::bad_request)?;
            filter.metadata.insert(meta_key.to_owned(), value);
        } else {
            return Err(ApiError::bad_request(format!(
                "unknown query parameter {key:?}: filter with state=… or metadata.KEY=VALUE, page with limit and cursor"
            )));
        }
    }
    if filter.cursor.is_some() && filter.limit.is_none() {
        return Err(ApiError::bad_request("cursor needs limit: pass the same limit as for the previous page"));
    }
    Ok(filter)
}

/// List the caller's sandboxes.
#[utoipa::path(
    get, path = "/v1/sandboxes", tag = "sandboxes",
    params(
        ("state" = Option<String>, Query, description = "running (default), destroyed, lost, expired or all"),
        ("metadata.KEY" = Option<String>, Query,
            description = "Only sandboxes whose metadata KEY equals the value; repeat for several keys (all must match)"),
        ("limit" = Option<usize>, Query, description = "Page size, 1 to 1000; without it every match is answered"),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page (with `limit`): the \
            page after its last sandbox by (creation time, id), so sandboxes created or ended meanwhile shift nothing"),
    ),
    responses(
        (status = 200, description = "The caller's sandboxes, oldest first (a page of them with `limit`)",
            body = SandboxList),
        (status = 400, description = "Unknown query parameter or state, a limit out of range, a malformed cursor",
            body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn list(
    State(state): State<AppState>,
    tenant: Tenant,
    QueryParams(pairs): QueryParams<Vec<(String, String)>>,
) -> Result<Json<SandboxList>, ApiError> {
    let filter = parse_list_query(pairs)?;
    let records = state.store().sandboxes(&tenant.name, filter.state).await?;
    let matching: Vec<_> =
        records.into_iter().filter(|r| filter.metadata.iter().all(|(k, v)| r.metadata.get(k) == Some(v))).collect();
    let limit = filter.limit.unwrap_or(usize::MAX);
    let page =
        page(matching, |record| (record.created_ms, record.id.as_str()), Order::Asc, limit, filter.cursor.as_ref());
    let sandboxes = page.items.into_iter().map(SandboxBody::from).collect();
    Ok(Json(SandboxList { sandboxes, next_cursor: page.next }))
}

/// Get one sandbox (in any state).
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "The sandbox", body = SandboxBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox for this tenant", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn get(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
) -> Result<Json<SandboxBody>, ApiError> {
    Ok(Json(own_sandbox(&state, &tenant, &id).await?.into()))
}

/// Destroy a sandbox. Deleting one that has already ended changes nothing.
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 204, description = "Destroyed (or had already ended)"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox for this tenant", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn delete(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
) -> Result<StatusCode, ApiError> {
    let record = own_sandbox(&state, &tenant, &id).await?;
    if !matches!(record.state, SandboxState::Running | SandboxState::Paused) {
        return Ok(StatusCode::NO_CONTENT);
    }
    end_running(&state, &tenant, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Set a running sandbox's timeout: it is destroyed `timeout_s` seconds from now.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/timeout", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = TimeoutRequest,
    responses(
        (status = 200, description = "The sandbox with its new expiry", body = SandboxBody),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox for this tenant", body = ErrorBody),
        (status = 409, description = "The sandbox has ended", body = ErrorBody),
        (status = 422, description = "timeout_s out of range", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn set_timeout(
    State(state): State<AppState>,
    tenant: Tenant,
    IdPath(id): IdPath,
    JsonBody(body): JsonBody<TimeoutRequest>,
) -> Result<Json<SandboxBody>, ApiError> {
    running_sandbox(&state, &tenant, &id).await?;
    let expires_ms = check_timeout(state.settings(), body.timeout_s)?;
    if !state.store().set_expiry(&tenant.name, &id, expires_ms).await? {
        // Ended between the check and the update.
        running_sandbox(&state, &tenant, &id).await?;
    }
    Ok(Json(own_sandbox(&state, &tenant, &id).await?.into()))
}
