//! The API's one error type: a stable code, an HTTP status and a message that says what to fix, answered as
//! `{"error": {"code", "message"}}`. Runtime failures, store failures and extractor rejections all map here.

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sandkasten_scan::Finding;
use sandkasten_types::{Failure, FailureKind};
use serde::Serialize;
use utoipa::ToSchema;

use crate::egress::PrepareError;
use crate::lifecycle::LifecycleError;
use crate::store::{QuotaExceeded, StoreError};

/// Stable machine-readable error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: the request is malformed (syntax, bad path, bad query).
    BadRequest,
    /// 401: no or unknown API key.
    Unauthorized,
    /// 403: the key is valid but the tenant may not do this (an admin-only route).
    Forbidden,
    /// 404: no such sandbox (or another tenant's), path or route.
    NotFound,
    /// 405: the route exists but not with this method.
    MethodNotAllowed,
    /// 409: the request conflicts with the current state (sandbox not running, path exists, not empty, ...).
    Conflict,
    /// 409: the sandbox is paused: resume it (`POST /v1/sandboxes/{id}/resume`), or create it with
    /// `lifecycle.auto_resume` so that requests resume it.
    Paused,
    /// 413: the body or file is larger than allowed.
    PayloadTooLarge,
    /// 422: well-formed but unacceptable values (limits out of range, unknown fields, wrong types, a misspelt
    /// `isolation`).
    Unprocessable,
    /// 422: the isolation tier asked for (or the server's default) cannot run sandboxes here: not available in this
    /// build yet (`microvm`, `auto`), or not installed on this host (`gvisor` without `runsc`); the message says how
    /// to get it. Nothing was created.
    TierUnavailable,
    /// 422: the static scan refused the code under the tenant's policy (mode `enforce`); `findings` says what it
    /// found, where, and what to do instead. Nothing was started (for `POST /v1/run`: no sandbox was created).
    ScanRefused,
    /// 429: a tenant quota would be exceeded.
    QuotaExceeded,
    /// 503: the isolation tier could not start the sandbox (runsc refused or died); the message says what it said.
    /// Nothing was created; retrying may help, and the operator should look at the tier (`sandkasten doctor`).
    TierFailed,
    /// 503: the snapshot store failed (unreachable, or it refused a write); the message names the operation. Nothing
    /// was kept; retrying may help, and the operator should look at the store (`[snapshots] store`).
    StoreFailed,
    /// 502: a request to a sandbox's port (`…/ports/{port}/…`) found nothing listening on that port inside the
    /// sandbox; start the server there first.
    NothingListening,
    /// 500: the server or runtime failed; never caused by input.
    Internal,
}

impl ErrorCode {
    /// The code's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Conflict => "conflict",
            ErrorCode::Paused => "paused",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::Unprocessable => "unprocessable",
            ErrorCode::TierUnavailable => "tier_unavailable",
            ErrorCode::ScanRefused => "scan_refused",
            ErrorCode::QuotaExceeded => "quota_exceeded",
            ErrorCode::TierFailed => "tier_failed",
            ErrorCode::StoreFailed => "store_failed",
            ErrorCode::NothingListening => "nothing_listening",
            ErrorCode::Internal => "internal",
        }
    }

    /// The HTTP status answered with this code.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorCode::BadRequest => StatusCode::BAD_REQUEST,
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::Forbidden => StatusCode::FORBIDDEN,
            ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::Conflict | ErrorCode::Paused => StatusCode::CONFLICT,
            ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::Unprocessable | ErrorCode::TierUnavailable | ErrorCode::ScanRefused => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            ErrorCode::QuotaExceeded => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::TierFailed | ErrorCode::StoreFailed => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::NothingListening => StatusCode::BAD_GATEWAY,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// The body of every error response.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// Code and message of an error response.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable code.
    pub code: ErrorCode,
    /// What went wrong and how to fix it.
    pub message: String,
    /// With `scan_refused`: the scan's findings (rule, severity, line, column, message).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<Finding>,
}

impl From<ApiError> for ErrorDetail {
    fn from(error: ApiError) -> Self {
        ErrorDetail { code: error.code, message: error.message, findings: error.findings }
    }
}

/// An error answered to the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct ApiError {
    /// Stable code (decides the status).
    pub code: ErrorCode,
    /// Message for the client.
    pub message: String,
    /// The scan's findings, when the scan refused the code (`scan_refused`).
    pub findings: Vec<Finding>,
}

/// Marks an error response with its code's wire name, for the errors metric (`sandkasten_errors_total{code}`); the E2B
/// facade's answers carry their Connect code names.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ErrorTag(pub(crate) &'static str);

impl ApiError {
    /// An error with a code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError { code, message: message.into(), findings: Vec::new() }
    }
    /// 422 `scan_refused` with the findings.
    pub fn scan_refused(message: impl Into<String>, findings: Vec<Finding>) -> Self {
        ApiError { code: ErrorCode::ScanRefused, message: message.into(), findings }
    }
    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::BadRequest, message)
    }
    /// 401.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unauthorized, message)
    }
    /// 403.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Forbidden, message)
    }
    /// 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }
    /// 409.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Conflict, message)
    }
    /// 413.
    pub fn payload_too_large(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::PayloadTooLarge, message)
    }
    /// 422.
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unprocessable, message)
    }
    /// 500; the detail goes to the log, the client gets a generic message.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        tracing::error!(error = %detail, "internal error");
        Self::new(ErrorCode::Internal, "internal server error; the details are in the server log")
    }
    /// The 404 for a sandbox id that does not exist or belongs to another tenant (indistinguishable on purpose).
    pub fn sandbox_not_found(id: &str) -> Self {
        Self::not_found(format!("sandbox {id} not found"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = self.code;
        let body = ErrorBody { error: ErrorDetail::from(self) };
        let mut response = (code.status(), Json(body)).into_response();
        response.extensions_mut().insert(ErrorTag(code.as_str()));
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        ApiError::internal(error)
    }
}

impl From<crate::ids::IdError> for ApiError {
    fn from(error: crate::ids::IdError) -> Self {
        ApiError::internal(error)
    }
}

impl From<QuotaExceeded> for ApiError {
    fn from(error: QuotaExceeded) -> Self {
        ApiError::new(ErrorCode::QuotaExceeded, error.to_string())
    }
}

impl From<Failure> for ApiError {
    fn from(failure: Failure) -> Self {
        let code = match failure.kind {
            FailureKind::NotFound => ErrorCode::NotFound,
            FailureKind::InvalidPath => ErrorCode::BadRequest,
            FailureKind::PermissionDenied | FailureKind::ExecFailed => ErrorCode::Unprocessable,
            FailureKind::AlreadyExists
            | FailureKind::NotADirectory
            | FailureKind::IsADirectory
            | FailureKind::NotEmpty
            | FailureKind::SandboxGone
            | FailureKind::Conflict
            | FailureKind::StdinFull => ErrorCode::Conflict,
            FailureKind::TooLarge => ErrorCode::PayloadTooLarge,
            FailureKind::TierFailed => ErrorCode::TierFailed,
            FailureKind::NothingListening => ErrorCode::NothingListening,
            FailureKind::Internal => return ApiError::internal(format!("runtime: {}", failure.message)),
        };
        ApiError::new(code, failure.message)
    }
}

impl From<PrepareError> for ApiError {
    fn from(error: PrepareError) -> Self {
        match error {
            PrepareError::Policy(message) => ApiError::bad_request(message),
            PrepareError::UnknownSecret(_) | PrepareError::HostlessSecret(_) => {
                ApiError::unprocessable(error.to_string())
            }
            PrepareError::Rules(_) => ApiError::bad_request(error.to_string()),
            PrepareError::Ca(_) => ApiError::internal(error),
            PrepareError::Store(error) => error.into(),
            PrepareError::Id(error) => error.into(),
        }
    }
}

impl From<LifecycleError> for ApiError {
    fn from(error: LifecycleError) -> Self {
        match error {
            LifecycleError::TierUnavailable(reason) => ApiError::new(ErrorCode::TierUnavailable, reason),
            LifecycleError::TimeoutOutOfRange { .. } | LifecycleError::TooManyPids(_) => {
                ApiError::unprocessable(error.to_string())
            }
            LifecycleError::Egress(error) => error.into(),
            LifecycleError::Id(error) => error.into(),
            LifecycleError::Store(error) => error.into(),
            LifecycleError::Quota(error) => error.into(),
            LifecycleError::Runtime(failure) => failure.into(),
            LifecycleError::EndedWhileCreating(_) | LifecycleError::NotRunning(_) | LifecycleError::NotPaused(_) => {
                ApiError::conflict(error.to_string())
            }
            LifecycleError::Paused(_) => ApiError::new(ErrorCode::Paused, error.to_string()),
            LifecycleError::ForkCountOutOfRange { .. } => ApiError::unprocessable(error.to_string()),
            LifecycleError::FilesNotCopied(_) | LifecycleError::SnapshotRefused(_) => {
                ApiError::conflict(error.to_string())
            }
            LifecycleError::SnapshotNotFound(_) => ApiError::not_found(error.to_string()),
            LifecycleError::SnapshotStore(_) => ApiError::new(ErrorCode::StoreFailed, error.to_string()),
            LifecycleError::AdmissionFailed | LifecycleError::DestroyFailed(_) | LifecycleError::TaskFailed(_) => {
                ApiError::internal(error)
            }
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::bad_request(rejection.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        ApiError::bad_request(rejection.body_text())
    }
}

/// The fallback for unknown routes.
pub(crate) async fn route_not_found() -> ApiError {
    ApiError::not_found("no such route; see /openapi.json for the API")
}

/// The fallback for known routes called with the wrong method.
pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::new(ErrorCode::MethodNotAllowed, "this route does not accept that method; see /openapi.json")
}

/// A template name that resolves to nothing: 422 saying how to build it; an unreadable cache is the server's fault.
impl From<crate::built_templates::ChooseError> for ApiError {
    fn from(error: crate::built_templates::ChooseError) -> Self {
        match error {
            crate::built_templates::ChooseError::Unknown(message) => ApiError::unprocessable(message),
            crate::built_templates::ChooseError::Cache(detail) => ApiError::internal(detail),
            crate::built_templates::ChooseError::Busy(message) => ApiError::conflict(message),
            crate::built_templates::ChooseError::Store(message) => ApiError::new(ErrorCode::StoreFailed, message),
        }
    }
}
