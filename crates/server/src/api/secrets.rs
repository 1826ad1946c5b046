//! A tenant's secrets: stored server-side, never returned, never inside a sandbox. A sandbox created with
//! `"secrets": ["NAME"]` sees a placeholder in `$NAME`; the egress proxy puts the value in request headers sent to the
//! secret's hosts only, over TLS (plain HTTP only to a port a host pattern names).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;

use crate::api::egress_schemas::{SecretBody, SecretList, SecretRequest};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::JsonBody;
use crate::auth::Tenant;
use crate::clock::{now_ms, rfc3339};
use crate::egress::store::{SecretInfo, StoredSecret};
use crate::state::AppState;

/// Longest secret value, in bytes.
const MAX_VALUE_BYTES: usize = 8 * 1024;
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
    if body.value.is_empty() || body.value.len() > MAX_VALUE_BYTES {
        return Err(ApiError::bad_request(format!("value must be 1 to {MAX_VALUE_BYTES} bytes")));
    }
    if body.value.chars().any(char::is_control) {
        return Err(ApiError::bad_request("value contains a control character; it must fit in an HTTP header"));
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
    SecretBody { name: secret.name, hosts: secret.hosts, updated_at: rfc3339(secret.updated_ms) }
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
    let secret = StoredSecret { name: name.clone(), value: body.value, hosts: body.hosts, updated_ms: now_ms() };
    let created = state.store().put_secret(&tenant.name, secret.clone()).await?;
    state.egress().update_secret(&tenant.name, &name, &secret.value, &secret.hosts);
    tracing::info!(tenant = %tenant.name, secret = %name, created, "secret written");
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    let StoredSecret { name, hosts, updated_ms, .. } = secret;
    Ok((status, Json(shown(SecretInfo { name, hosts, updated_ms }))))
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
