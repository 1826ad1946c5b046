//! A tenant's secrets: stored server-side, never returned, never inside a sandbox. A sandbox created with
//! `"secrets": ["NAME"]` sees a placeholder in `$NAME`; the egress proxy puts the value in request headers sent to the
//! secret's hosts only, over TLS (plain HTTP only to a port a host pattern names).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;

use crate::api::egress_schemas::{SecretBody, SecretList, SecretRequest};
use crate::api::error::{ApiError, ErrorBody, ErrorCode};
use crate::api::extract::JsonBody;
use crate::auth::Tenant;
use crate::clock::{now_ms, rfc3339};
use crate::egress::store::{SecretInfo, SecretWrite, SecretWriteMode, SecretWritten};
use crate::secret_rules::{MAX_SECRETS, metadata_problem, too_many, value_problem};
use crate::state::AppState;

/// Most host patterns per secret.
const MAX_HOSTS: usize = 64;

fn check_name(name: &str) -> Result<(), ApiError> {
    let mut bytes = name.bytes();
    let valid = (1..=128).contains(&name.len())
        && bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid {
        return Err(ApiError::bad_request(format!(
            "secret name {name:?} is invalid: it becomes an environment variable, so use 1 to 128 letters, digits \
             and '_', not starting with a digit"
        )));
    }
    if reserved(name) {
        return Err(ApiError::unprocessable(format!(
            "secret name {name:?} is a variable sandkasten sets in every sandbox (the environment's base, the proxy \
             variables, NODE_OPTIONS or the CA bundle variables): as a secret it would override it; choose another \
             name"
        )));
    }
    Ok(())
}

/// A variable sandkasten sets itself: the base environment, the proxy variables (both cases), Node's preload and the
/// interception CA's bundle variables.
fn reserved(name: &str) -> bool {
    sandkasten_runtime::sets_variable(name) || crate::egress::CA_BUNDLE_VARIABLES.contains(&name)
}

fn check_request(body: &SecretRequest) -> Result<(), ApiError> {
    if let Some(problem) = value_problem(&body.value) {
        return Err(ApiError::bad_request(problem));
    }
    if let Some(problem) = body.metadata.as_ref().and_then(metadata_problem) {
        return Err(ApiError::bad_request(problem));
    }
    if body.hosts.is_empty() || body.hosts.len() > MAX_HOSTS {
        return Err(ApiError::bad_request(format!(
            "hosts must list 1 to {MAX_HOSTS} host patterns the value may be sent to, e.g. [\"api.example.com\"]"
        )));
    }
    sandkasten_egress::check_secret_hosts(&body.hosts)
        .map_err(|error| ApiError::bad_request(format!("hosts: {error}")))?;
    Ok(())
}

fn shown(secret: SecretInfo) -> SecretBody {
    SecretBody {
        id: secret.id,
        name: secret.name,
        hosts: secret.hosts,
        metadata: secret.metadata,
        version: secret.version,
        created_at: rfc3339(secret.created_ms),
        updated_at: rfc3339(secret.updated_ms),
    }
}

/// Create or replace a secret. Running sandboxes that hold it use the new value and hosts at once (HTTPS to a host
/// added now is not intercepted in a sandbox created before: its CA is constrained to the hosts of its creation).
#[utoipa::path(
    put, path = "/v1/secrets/{name}", tag = "network",
    params(("name" = String, Path, description = "Secret name (an environment variable name)")),
    request_body = SecretRequest,
    responses(
        (status = 200, description = "Replaced", body = SecretBody),
        (status = 201, description = "Created", body = SecretBody),
        (status = 400, description = "Bad name, value or host pattern (named in the message)", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 422, description = "The name is a variable sandkasten sets in every sandbox (it would override it)", body = ErrorBody),
        (status = 429, description = "The tenant holds the most secrets it may (256): delete one first", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn put(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<SecretRequest>,
) -> Result<(StatusCode, Json<SecretBody>), ApiError> {
    check_name(&name)?;
    check_request(&body)?;
    let write = SecretWrite {
        name: name.clone(),
        value: body.value,
        hosts: Some(body.hosts),
        metadata: body.metadata,
        now_ms: now_ms(),
        max_secrets: MAX_SECRETS,
    };
    let (value, hosts) = (write.value.clone(), write.hosts.clone().unwrap_or_default());
    let (status, info) = match state.store().write_secret(&tenant.name, write, SecretWriteMode::CreateOrReplace).await?
    {
        SecretWritten::Created(info) => (StatusCode::CREATED, info),
        SecretWritten::Replaced(info) => (StatusCode::OK, info),
        SecretWritten::TooMany => return Err(ApiError::new(ErrorCode::QuotaExceeded, too_many())),
        SecretWritten::Exists | SecretWritten::Missing => {
            return Err(ApiError::internal("a create-or-replace neither created nor replaced"));
        }
    };
    state.egress().update_secret(&tenant.name, &name, &value, &hosts);
    tracing::info!(tenant = %tenant.name, secret = %name, version = info.version, "secret written");
    Ok((status, Json(shown(info))))
}

/// One secret (never its value).
#[utoipa::path(
    get, path = "/v1/secrets/{name}", tag = "network",
    params(("name" = String, Path, description = "Secret name (or its id, `sec_…`)")),
    responses(
        (status = 200, description = "The secret", body = SecretBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such secret", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn get(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(name): Path<String>,
) -> Result<Json<SecretBody>, ApiError> {
    match state.store().secret_info(&tenant.name, &name).await? {
        Some(info) => Ok(Json(shown(info))),
        None => Err(ApiError::not_found(format!("no secret named {name:?}; list them with GET /v1/secrets"))),
    }
}

/// The tenant's secrets (names and hosts; never values).
#[utoipa::path(
    get, path = "/v1/secrets", tag = "network",
    responses(
        (status = 200, description = "The secrets", body = SecretList),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn list(State(state): State<AppState>, tenant: Tenant) -> Result<Json<SecretList>, ApiError> {
    let secrets = state.store().secret_list(&tenant.name).await?.into_iter().map(shown).collect();
    Ok(Json(SecretList { secrets }))
}

/// Delete a secret. Sandboxes created with it keep their placeholder, which then goes out unreplaced.
#[utoipa::path(
    delete, path = "/v1/secrets/{name}", tag = "network",
    params(("name" = String, Path, description = "Secret name")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such secret", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn delete(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    if !state.store().delete_secret(&tenant.name, &name).await? {
        return Err(ApiError::not_found(format!("no secret named {name:?}; list them with GET /v1/secrets")));
    }
    state.egress().remove_secret(&tenant.name, &name);
    Ok(StatusCode::NO_CONTENT)
}
