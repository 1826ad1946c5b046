//! `POST /v1/scan`: the static scan on its own (findings and the verdict under the tenant's policy, tightened by the
//! request's), and the gate the run paths call before anything starts: `POST /v1/run`, `…/exec` (the command line
//! as bash) and `…/code` (the cell in its language). In `enforce` a blocking finding is 422 `scan_refused` with the
//! findings; in `warn` the findings go with the result; in `off` nothing is scanned.

use axum::Json;
use axum::extract::State;
use sandkasten_scan::{
    Finding, Mode, ScanError, ScanLanguage, ScanPolicy, ScanPolicyOverride, ScanReport, Verdict, scan, unreadable,
};
use serde::Deserialize;
use utoipa::ToSchema;

use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::JsonBody;
use crate::auth::Tenant;
use crate::state::AppState;

/// `POST /v1/scan`'s body.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScanBody {
    /// `python`, `javascript` (or `node`) or `bash`.
    pub language: ScanLanguage,
    /// The code.
    pub code: String,
    /// Changes to the tenant's scan policy for this scan; they may only tighten it (a loosening field is 422).
    #[serde(default)]
    pub policy: Option<ScanPolicyOverride>,
}

/// The tenant's policy tightened by a request's override; a loosening override is 422 naming the field.
pub(crate) fn effective_policy(tenant: &Tenant, change: Option<&ScanPolicyOverride>) -> Result<ScanPolicy, ApiError> {
    match change {
        None => Ok(ScanPolicy::clone(&tenant.scan)),
        Some(change) => tenant.scan.tightened(change).map_err(|loosening| {
            ApiError::unprocessable(format!("{loosening} (a request may only tighten its tenant's scan policy)"))
        }),
    }
}

/// Scans off the async workers (a scan may take up to its deadline).
async fn scan_blocking(language: ScanLanguage, code: String, policy: ScanPolicy) -> Result<ScanReport, ApiError> {
    let report = tokio::task::spawn_blocking(move || scan(language, &code, &policy))
        .await
        .map_err(|error| ApiError::internal(format!("the scan's task failed: {error}")))?;
    report.map_err(|error| match error {
        ScanError::TooLarge { .. } => ApiError::payload_too_large(error.to_string()),
        ScanError::Grammar { .. } => ApiError::internal(error),
    })
}

/// The gate before a run: under the tenant's policy (tightened by the request's), the findings to carry with the
/// result (`warn`, or `enforce` with nothing blocking; none in `off`), or 422 `scan_refused`.
pub(crate) async fn gate(
    tenant: &Tenant,
    change: Option<&ScanPolicyOverride>,
    language: ScanLanguage,
    code: &str,
) -> Result<Vec<Finding>, ApiError> {
    let policy = effective_policy(tenant, change)?;
    if policy.mode == Mode::Off {
        return Ok(Vec::new());
    }
    let report = scan_blocking(language, code.to_owned(), policy.clone()).await?;
    decided(report, &policy, language.as_str())
}

/// The gate for code in a language the scan has no grammar for (Java, R): it fails closed, as the scan does at its
/// bounds (`sandkasten_scan::unreadable`: refused under `enforce`, a finding under `warn`, nothing under `off`).
pub(crate) fn gate_unreadable(
    tenant: &Tenant,
    change: Option<&ScanPolicyOverride>,
    language: &str,
) -> Result<Vec<Finding>, ApiError> {
    let policy = effective_policy(tenant, change)?;
    if policy.mode == Mode::Off {
        return Ok(Vec::new());
    }
    decided(unreadable(language, &policy), &policy, language)
}

/// The findings to carry with the result, or 422 `scan_refused` when the report's verdict is to block.
fn decided(report: ScanReport, policy: &ScanPolicy, language: &str) -> Result<Vec<Finding>, ApiError> {
    if report.verdict == Verdict::Block {
        let blocking: Vec<String> =
            report.blocking(policy).take(3).map(|f| format!("{} at line {}", f.rule, f.line)).collect();
        let message = format!(
            "the static scan refused the {language} code under the tenant's policy (enforce): {}; see findings, \
             change the code and send it again",
            blocking.join(", ")
        );
        return Err(ApiError::scan_refused(message, report.findings));
    }
    Ok(report.findings)
}

/// Scan code without running it.
#[utoipa::path(
    post, path = "/v1/scan", tag = "scan",
    request_body = ScanBody,
    responses(
        (status = 200, description = "The findings and the verdict under the tenant's policy (tightened by \
            `policy`): `allow`, `warn` or `block` (what a run of this code would get)", body = ScanReport),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 413, description = "Body or code too large for the scan", body = ErrorBody),
        (status = 422, description = "Unknown language or field, or a `policy` that would loosen the tenant's \
            (the message names the field)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn scan_code(
    State(_state): State<AppState>,
    tenant: Tenant,
    JsonBody(body): JsonBody<ScanBody>,
) -> Result<Json<ScanReport>, ApiError> {
    Ok(Json(report(&tenant, body.language, body.code, body.policy.as_ref()).await?))
}

/// The findings of `code` and the verdict under the tenant's policy tightened by `change` (what `POST /v1/scan`
/// and the MCP `scan_code` tool answer).
pub(crate) async fn report(
    tenant: &Tenant,
    language: ScanLanguage,
    code: String,
    change: Option<&ScanPolicyOverride>,
) -> Result<ScanReport, ApiError> {
    let policy = effective_policy(tenant, change)?;
    scan_blocking(language, code, policy).await
}
