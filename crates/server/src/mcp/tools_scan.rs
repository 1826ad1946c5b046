//! The `scan_code` tool: the static scan of code without running it, under the tenant's scan policy (what
//! `POST /v1/scan` answers), so a model can check its code before it asks for a run.

use axum::http::request::Parts;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};
use sandkasten_scan::ScanLanguage;
use serde::Deserialize;

use crate::api::error::ApiError;
use crate::api::scan::report;
use crate::mcp::handler::{Caller, SandboxTools, answer};
use crate::mcp::render;

/// Arguments of `scan_code`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScanCodeArgs {
    /// The code's language: python, javascript or bash.
    language: ScanLanguage,
    /// The code.
    code: String,
}

#[tool_router(router = scan_tools, vis = "pub(super)")]
impl SandboxTools {
    /// `scan_code`.
    #[tool(description = "Scan code without running it: findings (rule, severity, line, column, what to do \
        instead) for process and eval calls, raw sockets, sensitive paths, destructive commands, fork bombs, \
        obfuscation and imports the tenant's policy does not allow, and the verdict a run would get (allow, warn or \
        block). Runs no sandbox.")]
    async fn scan_code(
        &self,
        Extension(parts): Extension<Parts>,
        Parameters(args): Parameters<ScanCodeArgs>,
    ) -> CallToolResult {
        answer(self.scan(&parts, args).await)
    }
}

impl SandboxTools {
    async fn scan(&self, parts: &Parts, args: ScanCodeArgs) -> Result<CallToolResult, ApiError> {
        let caller = Caller::of(parts)?;
        let scanned = report(&caller.tenant, args.language, args.code, None).await?;
        Ok(CallToolResult::success(render::scan(&scanned)))
    }
}
