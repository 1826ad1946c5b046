//! Who an E2B request acts for. Control-plane requests carry the tenant's API key as `X-API-KEY` (E2B's `e2b_…`
//! keys are ordinary sandkasten keys). Per-sandbox requests (envd, code interpreter) carry no API key: they name the
//! sandbox in `E2b-Sandbox-Id` and prove access with the sandbox's access token (`X-Access-Token`, or
//! `E2B-Traffic-Access-Token` on the code interpreter's context routes), which the create/connect answer handed out.
//!
//! Tokens (kept by `sessions`) are compared in constant time.

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use subtle::ConstantTimeEq;

use sandkasten_types::CommandUser;

use crate::auth::Tenant;
use crate::e2b::error::{Code, E2bError};
use crate::state::AppState;
use crate::store::{SandboxRecord, SandboxState};

/// The tenant of a control-plane request: `X-API-KEY`, or `Authorization: Bearer`.
pub(crate) fn api_tenant(state: &AppState, headers: &HeaderMap) -> Result<Tenant, E2bError> {
    let presented = match (headers.get("x-api-key"), headers.get(AUTHORIZATION)) {
        (Some(key), _) => key.as_bytes(),
        (None, Some(value)) => {
            let value = value.as_bytes();
            match value.get(..7) {
                Some(scheme) if scheme.eq_ignore_ascii_case(b"bearer ") => &value[7..],
                _ => b"",
            }
        }
        (None, None) => b"",
    };
    state.keyring().tenant_of_key(presented).ok_or_else(|| {
        E2bError::new(Code::Unauthenticated, "missing or invalid API key: set E2B_API_KEY to a sandkasten tenant key")
    })
}

/// A per-sandbox request's sandbox, checked: its id, owner and that it is running.
#[derive(Debug, Clone)]
pub(crate) struct SandboxAccess {
    /// The sandbox id.
    pub(crate) id: String,
    /// Its owner.
    pub(crate) tenant: Tenant,
    /// Its row (running).
    pub(crate) record: SandboxRecord,
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// What E2B's proxy answers for a sandbox that was killed or timed out: 502 (`unavailable`) with "was not found",
/// which the SDK turns into `SandboxNotRunningException`.
pub(crate) fn sandbox_gone(id: &str) -> E2bError {
    E2bError::new(Code::Unavailable, format!("sandbox {id} was not found: it was killed or reached its timeout"))
}

/// What a per-sandbox request for sandbox `id` gets when the facade has no session for it (unknown, ended, or from
/// before a restart): E2B's "was not found" 502.
pub(crate) fn no_session(id: &str) -> E2bError {
    E2bError::new(
        Code::Unavailable,
        format!("sandbox {id} was not found (after a server restart, call Sandbox.connect to open it again)"),
    )
}

/// The sandbox a per-sandbox request is for: `E2b-Sandbox-Id` with its access token. An unknown sandbox, a
/// sandbox that has ended (or that this server has no session for) is E2B's "was not found" 502; a wrong token
/// is `unauthenticated`.
pub(crate) async fn sandbox_access(state: &AppState, headers: &HeaderMap) -> Result<SandboxAccess, E2bError> {
    let id = header(headers, "e2b-sandbox-id")
        .ok_or_else(|| E2bError::invalid("missing header E2b-Sandbox-Id: set E2B_SANDBOX_URL to this server"))?;
    let presented = header(headers, "x-access-token").or_else(|| header(headers, "e2b-traffic-access-token"));
    let Some(session) = state.e2b().get(id) else { return Err(no_session(id)) };
    let valid = presented.is_some_and(|presented| bool::from(session.token.as_bytes().ct_eq(presented.as_bytes())));
    if !valid {
        return Err(E2bError::new(Code::Unauthenticated, format!("missing or wrong access token for sandbox {id}")));
    }
    running_access(state, id, session).await
}

/// The sandbox `id` of an already authorised request (`session` is its session): settled, resumed when it pauses
/// with `autoResume`, else E2B's "was not found" when it is not running.
pub(crate) async fn running_access(
    state: &AppState,
    id: &str,
    session: crate::e2b::sessions::Session,
) -> Result<SandboxAccess, E2bError> {
    // A pause or resume in progress settles first: nothing reaches a sandbox half paused.
    state.transitions().settled(id).await;
    let record = state.store().sandbox(&session.tenant.name, id).await.map_err(crate::api::error::ApiError::from)?;
    match record {
        Some(record) if record.state == SandboxState::Running => {
            Ok(SandboxAccess { id: id.to_owned(), tenant: session.tenant, record })
        }
        Some(record) if record.state == SandboxState::Paused => {
            // Its session stays: resumed (by this request with autoResume, or by Sandbox.connect) it is served again.
            if !record.lifecycle.auto_resume {
                return Err(crate::lifecycle::LifecycleError::Paused(id.to_owned()).into());
            }
            crate::lifecycle::ensure_resumed(state, &session.tenant, id).await?;
            Ok(SandboxAccess { id: id.to_owned(), tenant: session.tenant, record })
        }
        _ => {
            state.e2b().close(id);
            Err(sandbox_gone(id))
        }
    }
}

/// The user a per-sandbox request runs as (`Authorization: Basic base64(user:)`); `user` when absent.
pub(crate) fn request_user(headers: &HeaderMap) -> Result<String, E2bError> {
    use base64::Engine as _;
    let Some(value) = header(headers, "authorization") else {
        return Ok(String::from("user"));
    };
    let encoded = value
        .strip_prefix("Basic ")
        .ok_or_else(|| E2bError::invalid("the Authorization header of a sandbox request must be 'Basic <user:>'"))?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or_else(|| E2bError::invalid("the Authorization header is not base64 of 'user:'"))?;
    let user = decoded.split(':').next().unwrap_or_default();
    Ok(if user.is_empty() { String::from("user") } else { user.to_owned() })
}

/// The error of a failed runtime call on sandbox `id` (a vanished sandbox is also marked lost, as everywhere).
pub(crate) async fn runtime_failure(state: &AppState, id: &str, failure: sandkasten_types::Failure) -> E2bError {
    match crate::lifecycle::note_lost(state, id, failure).await {
        Ok(failure) => E2bError::from(failure),
        Err(error) => E2bError::from(crate::api::error::ApiError::from(error)),
    }
}

/// The sandbox user a request names: `user` (uid 1000) or `root` (uid 0 inside the sandbox, without capabilities);
/// any other name is refused.
pub(crate) fn sandbox_user(user: &str) -> Result<CommandUser, E2bError> {
    match user {
        "user" => Ok(CommandUser::Sandbox),
        "root" => Ok(CommandUser::Root),
        other => Err(E2bError::new(
            Code::PermissionDenied,
            format!(
                "user {other:?} is not available: a sandbox has 'user' (uid 1000) and 'root' (uid 0 in the sandbox, \
                 without capabilities)"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn basic_user_header_is_decoded() {
        let mut headers = HeaderMap::new();
        assert_eq!(request_user(&headers).ok().as_deref(), Some("user"));
        headers.insert("authorization", HeaderValue::from_static("Basic cm9vdDo="));
        assert_eq!(request_user(&headers).ok().as_deref(), Some("root"));
        headers.insert("authorization", HeaderValue::from_static("Bearer x"));
        assert!(request_user(&headers).is_err());
    }
}
