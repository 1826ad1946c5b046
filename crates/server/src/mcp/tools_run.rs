//! The `run_code` and `exec` tools: a cell in a stateful interpreter, a shell command; each in a one-shot sandbox
//! (killed after the call), a named session sandbox (created on first use) or a sandbox by id.

use axum::http::request::Parts;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};
use serde::Deserialize;

use crate::api::code::run_cell;
use crate::api::code_schemas::{CodeBody, LanguageName};
use crate::api::error::ApiError;
use crate::api::exec::run_to_end;
use crate::api::schemas::ExecBody;
use crate::mcp::handler::{Caller, SandboxTools, Target, answer};
use crate::mcp::render;

/// Arguments of `run_code`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunCodeArgs {
    /// `python` or `javascript`.
    language: LanguageName,
    /// The source; the value of its last expression is returned, matplotlib figures come back as PNG images.
    code: String,
    /// Where to run: omit for a fresh sandbox killed afterwards; a name (e.g. "main") for this session's sandbox
    /// of that name, created on first use, whose variables and files persist across calls; or a sandbox id (sb-…).
    #[serde(default)]
    sandbox: Option<String>,
    /// Interrupt the code after this many milliseconds; default and maximum the sandbox's time limit.
    #[serde(default)]
    timeout_ms: Option<u64>,
}

/// Arguments of `exec`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExecArgs {
    /// A shell command line, run with `/bin/bash -c` in `/workspace`.
    command: String,
    /// Where to run: omit for a fresh sandbox killed afterwards; a name for this session's sandbox of that name
    /// (created on first use); or a sandbox id (sb-…).
    #[serde(default)]
    sandbox: Option<String>,
    /// Working directory (absolute); default `/workspace`.
    #[serde(default)]
    cwd: Option<String>,
    /// Text written to the command's stdin.
    #[serde(default)]
    stdin: Option<String>,
    /// Kill the command after this many milliseconds; default and maximum the sandbox's time limit.
    #[serde(default)]
    timeout_ms: Option<u64>,
}

#[tool_router(router = run_tools, vis = "pub(super)")]
impl SandboxTools {
    /// `run_code`.
    #[tool(description = "Run Python or JavaScript code in a sandbox and answer its stdout, stderr, the value of \
        the last expression, the error it raised, and figures as PNG images. Without `sandbox` it runs in a fresh \
        sandbox killed afterwards; with sandbox: \"NAME\" in this session's sandbox of that name, where variables \
        persist across calls.")]
    async fn run_code(
        &self,
        Extension(parts): Extension<Parts>,
        Parameters(args): Parameters<RunCodeArgs>,
    ) -> CallToolResult {
        answer(self.code(&parts, args).await)
    }

    /// `exec`.
    #[tool(description = "Run a shell command in a sandbox and answer its exit code (or signal), which limit \
        fired (time, memory, pids, disk, output), stdout and stderr. Without `sandbox` it runs in a fresh sandbox \
        killed afterwards; with sandbox: \"NAME\" in this session's sandbox of that name (files persist).")]
    async fn exec(&self, Extension(parts): Extension<Parts>, Parameters(args): Parameters<ExecArgs>) -> CallToolResult {
        answer(self.command(&parts, args).await)
    }
}

impl SandboxTools {
    async fn code(&self, parts: &Parts, args: RunCodeArgs) -> Result<CallToolResult, ApiError> {
        let caller = Caller::of(parts)?;
        let (id, one_shot) = self.resolve(&caller, Target::parse(args.sandbox)?).await?;
        let body = CodeBody {
            language: Some(args.language),
            code: args.code,
            context_id: None,
            timeout_ms: args.timeout_ms,
            scan_policy: None,
            env: std::collections::BTreeMap::new(),
        };
        let result = run_cell(&self.state, &caller.tenant, &id, body).await;
        if one_shot {
            self.kill(&caller, &id).await?;
        }
        Ok(CallToolResult::success(render::cell(&result?, one_shot)))
    }

    async fn command(&self, parts: &Parts, args: ExecArgs) -> Result<CallToolResult, ApiError> {
        let caller = Caller::of(parts)?;
        let (id, one_shot) = self.resolve(&caller, Target::parse(args.sandbox)?).await?;
        let body = ExecBody {
            cmd: Some(args.command),
            cwd: args.cwd,
            stdin: args.stdin,
            timeout_ms: args.timeout_ms,
            ..ExecBody::default()
        };
        let result = run_to_end(&self.state, &caller.tenant, &id, body).await;
        if one_shot {
            self.kill(&caller, &id).await?;
        }
        Ok(CallToolResult::success(render::exec(&result?)))
    }
}
