//! E2B's secrets API (`Secret.create/update/get_info/list/exists/destroy`): `POST /secrets`, `GET /secrets`,
//! `GET|POST|DELETE /secrets/{id or name}`, on the tenant's own secrets — the same rows as `PUT /v1/secrets/{name}`
//! (`egress::store`), so a secret made here is what `${e2b.secrets.NAME}` in `network.rules` resolves, and a change
//! reaches running sandboxes at once. Such a secret has no hosts: it goes only where a header rule puts it.
//!
//! As E2B answers: a secret is `{secretID, name, currentVersion, metadata, createdAt, updatedAt}`, never its value;
//! names are lowercased before storage; an update writes a new version and replaces the metadata only when given;
//! lists are newest first, paged by `limit` and `nextToken` (`x-next-token`); errors are `{"code", "message"}`
//! (400 bad input, 404 unknown, 409 a name taken, 429 the tenant's bound of secrets reached).

use std::collections::BTreeMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::{Deserialize, Serialize};

use crate::api::error::ApiError;
use crate::auth::Tenant;
use crate::clock::{now_ms, rfc3339};
use crate::e2b::auth::api_tenant;
use crate::e2b::error::{Code, E2bError, json_body};
use crate::e2b::paging;
use crate::egress::store::{SecretInfo, SecretMetadata, SecretWrite, SecretWriteMode, SecretWritten};
use crate::listing::{Order, Page, page};
use crate::secret_rules::{MAX_SECRETS, e2b_name, metadata_problem, too_many, value_problem};
use crate::state::AppState;

/// E2B's `Secret`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SecretAnswer {
    #[serde(rename = "secretID")]
    secret_id: String,
    name: String,
    current_version: i64,
    metadata: SecretMetadata,
    created_at: String,
    updated_at: String,
}

impl From<SecretInfo> for SecretAnswer {
    fn from(info: SecretInfo) -> Self {
        SecretAnswer {
            secret_id: info.id,
            name: info.name,
            current_version: info.version,
            metadata: info.metadata,
            created_at: rfc3339(info.created_ms),
            updated_at: rfc3339(info.updated_ms),
        }
    }
}

/// `POST /secrets` (`NewSecret`) and `POST /secrets/{id}` (`SecretUpdate`, without `name`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SecretBody {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
}

/// The value and metadata of a write, checked.
fn checked(body: &SecretBody) -> Result<String, E2bError> {
    let value = body.value.clone().ok_or_else(|| E2bError::invalid("give the secret's value as \"value\""))?;
    if let Some(problem) = value_problem(&value) {
        return Err(E2bError::invalid(problem));
    }
    if let Some(problem) = body.metadata.as_ref().and_then(metadata_problem) {
        return Err(E2bError::invalid(problem));
    }
    Ok(value)
}

fn not_found(key: &str) -> E2bError {
    E2bError::new(Code::NotFound, format!("secret {key:?} not found"))
}

/// Writes `write` as `mode` allows and tells running sandboxes; the answer's secret.
async fn write(
    state: &AppState,
    tenant: &Tenant,
    write: SecretWrite,
    mode: SecretWriteMode,
) -> Result<SecretInfo, E2bError> {
    let (name, value) = (write.name.clone(), write.value.clone());
    let info = match state.store().write_secret(&tenant.name, write, mode).await.map_err(ApiError::from)? {
        SecretWritten::Created(info) | SecretWritten::Replaced(info) => info,
        SecretWritten::Exists => {
            return Err(E2bError::new(Code::AlreadyExists, format!("secret {name:?} already exists")));
        }
        SecretWritten::Missing => return Err(not_found(&name)),
        SecretWritten::TooMany => return Err(E2bError::new(Code::ResourceExhausted, too_many())),
    };
    state.egress().update_secret(&tenant.name, &info.name, &value, &info.hosts);
    tracing::info!(tenant = %tenant.name, secret = %info.name, version = info.version, "secret written (e2b)");
    Ok(info)
}

/// The tenant's secret named or identified by `key`.
async fn find(state: &AppState, tenant: &Tenant, key: &str) -> Result<SecretInfo, E2bError> {
    state.store().secret_info(&tenant.name, key).await.map_err(ApiError::from)?.ok_or_else(|| not_found(key))
}

/// `POST /secrets`: 201 with the new secret (version 1).
pub(crate) async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<SecretAnswer>), E2bError> {
    let tenant = api_tenant(&state, &headers)?;
    let body: SecretBody = json_body(&body)?;
    let name = body.name.as_deref().ok_or_else(|| E2bError::invalid("give the secret's name as \"name\""))?;
    let name = e2b_name(name).map_err(E2bError::invalid)?;
    let value = checked(&body)?;
    let request =
        SecretWrite { name, value, hosts: None, metadata: body.metadata, now_ms: now_ms(), max_secrets: MAX_SECRETS };
    let info = write(&state, &tenant, request, SecretWriteMode::Create).await?;
    Ok((StatusCode::CREATED, Json(info.into())))
}

/// `POST /secrets/{id}`: a new version of the value (metadata replaced when given); 404 for an unknown secret.
pub(crate) async fn update(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(key): Path<String>,
    body: Bytes,
) -> Result<Json<SecretAnswer>, E2bError> {
    let tenant = api_tenant(&state, &headers)?;
    let body: SecretBody = json_body(&body)?;
    if body.name.is_some() {
        return Err(E2bError::invalid("a secret's name cannot be changed: create another secret"));
    }
    let value = checked(&body)?;
    let name = find(&state, &tenant, &key).await?.name;
    let request =
        SecretWrite { name, value, hosts: None, metadata: body.metadata, now_ms: now_ms(), max_secrets: MAX_SECRETS };
    Ok(Json(write(&state, &tenant, request, SecretWriteMode::Update).await?.into()))
}

/// `GET /secrets/{id}`.
pub(crate) async fn info(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(key): Path<String>,
) -> Result<Json<SecretAnswer>, E2bError> {
    let tenant = api_tenant(&state, &headers)?;
    Ok(Json(find(&state, &tenant, &key).await?.into()))
}

/// `DELETE /secrets/{id}`: 204; 404 (the SDK's `False`) for an unknown secret. Sandboxes whose rules name it no
/// longer get its header.
pub(crate) async fn destroy(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(key): Path<String>,
) -> Result<StatusCode, E2bError> {
    let tenant = api_tenant(&state, &headers)?;
    let name = find(&state, &tenant, &key).await?.name;
    if !state.store().delete_secret(&tenant.name, &name).await.map_err(ApiError::from)? {
        return Err(not_found(&key));
    }
    state.egress().remove_secret(&tenant.name, &name);
    Ok(StatusCode::NO_CONTENT)
}

/// The query of `GET /secrets`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ListQuery {
    limit: Option<String>,
    next_token: Option<String>,
}

/// `GET /secrets`: the tenant's secrets (those made with `PUT /v1/secrets` too), newest first, paged.
pub(crate) async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, E2bError> {
    let tenant = api_tenant(&state, &headers)?;
    let Query(query) = query.map_err(|rejection| E2bError::invalid(rejection.body_text()))?;
    let limit = paging::limit(query.limit.as_deref())?;
    let after = paging::after(query.next_token.as_deref(), Order::Desc)?;
    let secrets = state.store().secret_list(&tenant.name).await.map_err(ApiError::from)?;
    let page = page(secrets, |info| (info.created_ms, info.id.as_str()), Order::Desc, limit, after.as_ref());
    Ok(paging::answer(Page {
        items: page.items.into_iter().map(SecretAnswer::from).collect::<Vec<_>>(),
        next: page.next,
    }))
}
