//! Signed file URLs: what the SDK's `download_url`/`upload_url` build for a secured sandbox (every sandbox here: the
//! facade hands every one an access token). The URL carries no token, only `signature` = `v1_` + unpadded base64 of
//! SHA-256 over `path:operation:user:token` (`:expiration` appended when `signature_expiration`, a Unix time in
//! seconds, is given), computed by the SDK from the access token, as envd checks it. `GET`/`POST /files` with a valid
//! `X-Access-Token` need no signature; without one a missing, wrong or expired signature is 401 with envd's words.
//!
//! A browser opening such a URL sends no `E2b-Sandbox-Id`; the URL itself names the sandbox: E2B's own URLs by host
//! name (`49983-SANDBOXID.DOMAIN`, which `ports::route_by_host` turns into that header), others by `?sandbox_id=`
//! (with `E2B_SANDBOX_URL` every sandbox has the same URL, so the SDK's URL names none: add it). The signature is
//! checked against that one sandbox's token only; sessions are never searched for a token that fits, which would
//! cost a hash per live sandbox per request.

use axum::http::HeaderMap;
use base64::Engine as _;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq;

use crate::e2b::auth::{SandboxAccess, no_session, running_access, sandbox_access};
use crate::e2b::error::{Code, E2bError};
use crate::state::AppState;

/// What a signature allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    /// A download (`GET /files`).
    Read,
    /// An upload (`POST /files`).
    Write,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Read => "read",
            Operation::Write => "write",
        }
    }
}

/// The signing query parameters of a `/files` request, as the client sent them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Signed<'a> {
    /// `path`, exactly as sent (the signature covers the text, not the resolved path).
    pub(crate) path: &'a str,
    /// `username` (empty when absent: the default user).
    pub(crate) user: &'a str,
    /// `signature`.
    pub(crate) signature: Option<&'a str>,
    /// `signature_expiration`, Unix seconds.
    pub(crate) expiration: Option<i64>,
    /// `sandbox_id`: the sandbox whose token made the signature, for URLs that name it nowhere else (the SDK's URL
    /// with `E2B_SANDBOX_URL` set carries none; the signature does not cover it, it only picks the token to check).
    pub(crate) sandbox: Option<&'a str>,
}

/// envd's v1 signature of `path` for `operation` by `user` with the access token `token`.
pub(crate) fn signature(path: &str, operation: Operation, user: &str, token: &str, expiration: Option<i64>) -> String {
    let mut raw = format!("{path}:{}:{user}:{token}", operation.as_str());
    if let Some(expiration) = expiration {
        raw.push_str(&format!(":{expiration}"));
    }
    let digest = Sha256::digest(raw.as_bytes());
    format!("v1_{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest))
}

fn unauthorized(message: &str) -> E2bError {
    E2bError::new(Code::Unauthenticated, message)
}

fn now_unix_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX))
}

/// The sandbox a `/files` request may use: by its access token when it sends one (the SDK's own calls), else by the
/// URL's signature (401 when it is missing, wrong or expired). The signature is checked against the one sandbox
/// the request names (`E2b-Sandbox-Id`, which a host name `49983-ID.DOMAIN` stands for, or `?sandbox_id=`): one
/// map access and one hash, whatever the number of sandboxes.
pub(crate) async fn file_access(
    state: &AppState,
    headers: &HeaderMap,
    signed: Signed<'_>,
    operation: Operation,
) -> Result<SandboxAccess, E2bError> {
    if headers.contains_key("x-access-token") {
        return sandbox_access(state, headers).await;
    }
    let named = headers.get("e2b-sandbox-id").and_then(|value| value.to_str().ok()).or(signed.sandbox);
    let id = named.ok_or_else(|| {
        unauthorized(
            "the URL names no sandbox: open it at the sandbox's host name (49983-SANDBOXID.DOMAIN, as the SDK builds \
             it without E2B_SANDBOX_URL), add &sandbox_id=SANDBOXID, or send the E2b-Sandbox-Id header",
        )
    })?;
    // Unknown or ended: the same answer as for a token.
    let Some(session) = state.e2b().get(id) else { return Err(no_session(id)) };
    check(signed, operation, &session.token, now_unix_s())?;
    running_access(state, id, session).await
}

/// Whether `signed` is a valid signature for `operation` made with `token` (the one sandbox's access token) and not
/// expired at `now` (Unix seconds).
fn check(signed: Signed<'_>, operation: Operation, token: &str, now: i64) -> Result<(), E2bError> {
    let Some(presented) = signed.signature else {
        return Err(unauthorized(
            "missing signature query parameter: send the access token as X-Access-Token or use the SDK's \
             download_url/upload_url",
        ));
    };
    let expected = signature(signed.path, operation, signed.user, token, signed.expiration);
    if !bool::from(expected.as_bytes().ct_eq(presented.as_bytes())) {
        return Err(unauthorized("invalid signature"));
    }
    if signed.expiration.is_some_and(|expiration| expiration < now) {
        return Err(unauthorized("signature is already expired"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_envd_s_v1() {
        // The SDK's get_signature("/home/user/a.txt", "read", None, "token", None), computed by hand:
        // sha256("/home/user/a.txt:read::token"), base64 without padding.
        let digest = Sha256::digest(b"/home/user/a.txt:read::token");
        let expected = format!("v1_{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest));
        assert_eq!(signature("/home/user/a.txt", Operation::Read, "", "token", None), expected);
        assert!(!expected.ends_with('='));
        let with_expiry = signature("/home/user/a.txt", Operation::Read, "", "token", Some(1_700_000_000));
        let digest = Sha256::digest(b"/home/user/a.txt:read::token:1700000000");
        assert_eq!(with_expiry, format!("v1_{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)));
        assert_ne!(
            signature("/a", Operation::Read, "user", "token", None),
            signature("/a", Operation::Write, "user", "token", None),
            "a download's signature does not allow an upload"
        );
    }

    fn signed<'a>(signature: Option<&'a str>, expiration: Option<i64>) -> Signed<'a> {
        Signed { path: "/home/user/a.txt", user: "", signature, expiration, sandbox: Some("sb-0123456789abcdef") }
    }

    #[test]
    fn one_token_is_checked_and_wrong_or_expired_signatures_are_refused() {
        let good = signature("/home/user/a.txt", Operation::Read, "", "token", Some(100));
        assert!(check(signed(Some(&good), Some(100)), Operation::Read, "token", 99).is_ok());
        let expired = check(signed(Some(&good), Some(100)), Operation::Read, "token", 101);
        assert!(expired.is_err_and(|error| error.message.contains("expired")));
        let other_token = check(signed(Some(&good), Some(100)), Operation::Read, "another", 99);
        assert!(other_token.is_err_and(|error| error.message.contains("invalid signature")));
        assert!(check(signed(Some(&good), Some(100)), Operation::Write, "token", 99).is_err(), "a download's");
        assert!(check(signed(None, None), Operation::Read, "token", 0).is_err_and(|e| e.message.contains("missing")));
    }
}
