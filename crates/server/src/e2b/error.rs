//! The facade's one error type and its two wire shapes: E2B's REST and envd HTTP errors
//! (`{"code": <http status>, "message"}`) and Connect errors (`{"code": "not_found", "message"}`, also carried in a
//! stream's end message). Native API errors and runtime failures map here.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sandkasten_types::{Failure, FailureKind};
use serde::Serialize;

use crate::api::error::{ApiError, ErrorCode, ErrorTag};
use crate::lifecycle::LifecycleError;

/// The Connect error codes the facade answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    /// 400: malformed request or unacceptable value.
    InvalidArgument,
    /// 401: no or unknown key or access token.
    Unauthenticated,
    /// 403: the sandbox user may not do this.
    PermissionDenied,
    /// 404: no such sandbox, process or path.
    NotFound,
    /// 409: the target exists already.
    AlreadyExists,
    /// 400: the target is in the wrong state (not a directory, not empty, process ended).
    FailedPrecondition,
    /// 429: a quota or size limit.
    ResourceExhausted,
    /// 504: a time limit ran out.
    DeadlineExceeded,
    /// 501: sandkasten does not do this (yet).
    Unimplemented,
    /// 502: the sandbox is gone.
    Unavailable,
    /// 500: the server failed.
    Internal,
}

impl Code {
    /// The Connect wire name.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::Unauthenticated => "unauthenticated",
            Code::PermissionDenied => "permission_denied",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::FailedPrecondition => "failed_precondition",
            Code::ResourceExhausted => "resource_exhausted",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::Unimplemented => "unimplemented",
            Code::Unavailable => "unavailable",
            Code::Internal => "internal",
        }
    }

    /// The HTTP status of a unary Connect error (the Connect protocol's table), and of the REST error.
    pub(crate) fn status(self) -> StatusCode {
        match self {
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::BAD_GATEWAY,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// An error answered by the facade: a code and a message for the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub(crate) struct E2bError {
    /// What kind of error.
    pub(crate) code: Code,
    /// What went wrong.
    pub(crate) message: String,
}

impl E2bError {
    /// An error with a code and message.
    pub(crate) fn new(code: Code, message: impl Into<String>) -> Self {
        E2bError { code, message: message.into() }
    }

    /// 400.
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    /// 404 for a sandbox that does not exist, belongs to another tenant or has ended (E2B does not tell them apart).
    pub(crate) fn sandbox_not_found(id: &str) -> Self {
        Self::new(Code::NotFound, format!("sandbox {id} not found"))
    }

    /// 501 for what sandkasten does not do.
    pub(crate) fn unsupported(what: &str) -> Self {
        Self::new(Code::Unimplemented, format!("{what} is not supported by sandkasten"))
    }

    /// The Connect error JSON (`{"code", "message"}`), as in unary error bodies and stream end messages.
    pub(crate) fn connect_json(&self) -> serde_json::Value {
        serde_json::json!({ "code": self.code.as_str(), "message": self.message })
    }

    /// The answer in the Connect protocol's unary shape.
    pub(crate) fn into_connect(self) -> Response {
        let mut response = (self.code.status(), Json(self.connect_json())).into_response();
        response.extensions_mut().insert(ErrorTag(self.code.as_str()));
        response
    }
}

/// The REST/envd HTTP shape: `{"code": <status>, "message"}` with that status.
#[derive(Serialize)]
struct RestBody {
    code: u16,
    message: String,
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let status = self.code.status();
        let mut response = (status, Json(RestBody { code: status.as_u16(), message: self.message })).into_response();
        response.extensions_mut().insert(ErrorTag(self.code.as_str()));
        response
    }
}

impl From<LifecycleError> for E2bError {
    fn from(error: LifecycleError) -> Self {
        E2bError::from(ApiError::from(error))
    }
}

impl From<ApiError> for E2bError {
    fn from(error: ApiError) -> Self {
        let code = match error.code {
            ErrorCode::BadRequest | ErrorCode::Unprocessable | ErrorCode::TierUnavailable => Code::InvalidArgument,
            ErrorCode::Unauthorized => Code::Unauthenticated,
            ErrorCode::Forbidden => Code::PermissionDenied,
            ErrorCode::NotFound => Code::NotFound,
            ErrorCode::MethodNotAllowed => Code::Unimplemented,
            ErrorCode::Conflict | ErrorCode::Paused | ErrorCode::ScanRefused => Code::FailedPrecondition,
            ErrorCode::PayloadTooLarge | ErrorCode::QuotaExceeded => Code::ResourceExhausted,
            ErrorCode::TierFailed | ErrorCode::StoreFailed | ErrorCode::NothingListening => Code::Unavailable,
            ErrorCode::Internal => Code::Internal,
        };
        E2bError::new(code, error.message)
    }
}

impl From<Failure> for E2bError {
    fn from(failure: Failure) -> Self {
        let code = match failure.kind {
            FailureKind::NotFound => Code::NotFound,
            FailureKind::InvalidPath => Code::InvalidArgument,
            FailureKind::PermissionDenied => Code::PermissionDenied,
            FailureKind::AlreadyExists => Code::AlreadyExists,
            FailureKind::NotADirectory
            | FailureKind::IsADirectory
            | FailureKind::NotEmpty
            | FailureKind::ExecFailed
            | FailureKind::Conflict => Code::FailedPrecondition,
            FailureKind::TooLarge | FailureKind::StdinFull => Code::ResourceExhausted,
            FailureKind::SandboxGone | FailureKind::TierFailed | FailureKind::NothingListening => Code::Unavailable,
            FailureKind::Internal => return ApiError::internal(format!("runtime: {}", failure.message)).into(),
        };
        E2bError::new(code, failure.message)
    }
}

/// A request body the facade reads as JSON: empty is `T`'s default (the SDK sends none for some calls), anything
/// that is not `T` is `invalid_argument` naming the field and why.
pub(crate) fn json_body<T: serde::de::DeserializeOwned + Default>(body: &[u8]) -> Result<T, E2bError> {
    if body.is_empty() {
        return Ok(T::default());
    }
    parse_json(body)
}

/// A request body that must be a JSON `T`: anything else is `invalid_argument` naming the field and why.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, E2bError> {
    serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(body)).map_err(|error| {
        let at = error.path().to_string();
        let field = if at == "." { String::new() } else { format!("{at}: ") };
        E2bError::invalid(format!("malformed request body: {field}{}", error.inner()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_codes_have_the_protocols_statuses() {
        assert_eq!(Code::NotFound.status(), StatusCode::NOT_FOUND);
        assert_eq!(Code::InvalidArgument.status(), StatusCode::BAD_REQUEST);
        assert_eq!(Code::DeadlineExceeded.status(), StatusCode::GATEWAY_TIMEOUT);
        let json = E2bError::new(Code::AlreadyExists, "x exists").connect_json();
        assert_eq!(json, serde_json::json!({"code": "already_exists", "message": "x exists"}));
    }

    #[test]
    fn runtime_failures_keep_their_kind() {
        let failure = Failure::new(FailureKind::AlreadyExists, "exists");
        assert_eq!(E2bError::from(failure).code, Code::AlreadyExists);
        let failure = Failure::new(FailureKind::NotFound, "missing");
        assert_eq!(E2bError::from(failure).code, Code::NotFound);
    }
}
