//! The `create_sandbox` and `kill_sandbox` tools.

use axum::http::request::Parts;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::{tool, tool_router};
use sandkasten_types::Tier;
use serde::Deserialize;

use crate::api::egress_schemas::NetworkPolicyBody;
use crate::api::error::ApiError;
use crate::api::schemas::CreateSandboxRequest;
use crate::mcp::handler::{Caller, SandboxTools, answer, check_name};

/// Arguments of `create_sandbox`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateSandboxArgs {
    /// Isolation tier: `process` (namespaces, seccomp, cgroups; fastest) or `gvisor` (a user-space kernel; for
    /// code that may attack the kernel). Default: the server's.
    #[serde(default)]
    isolation: Option<Tier>,
    /// Template: `host` (default), `e2b` (user `user`, home `/home/user`) or the name of a template built on the
    /// server (its packages read-only at `/opt`).
    #[serde(default)]
    template: Option<String>,
    /// Network access; default none. `{"mode": "allowlist", "allow": ["pypi.org", "*.example.com:443"]}` lets the
    /// sandbox reach only those hosts.
    #[serde(default)]
    network: Option<NetworkPolicyBody>,
    /// Seconds until the sandbox is destroyed; default the server's (300).
    #[serde(default)]
    timeout_s: Option<u64>,
    /// Keep the sandbox when this MCP session ends (kill it with kill_sandbox, or it ends at its timeout).
    #[serde(default)]
    persist: bool,
    /// A name for it in this session, so run_code, exec and the file tools can say `sandbox: "NAME"`.
    #[serde(default)]
    name: Option<String>,
}

/// Arguments of `kill_sandbox`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct KillSandboxArgs {
    /// The sandbox: its id (sb-…) or this session's name for it.
    sandbox: String,
}

#[tool_router(router = lifecycle_tools, vis = "pub(super)")]
impl SandboxTools {
    /// `create_sandbox`.
    #[tool(description = "Create a sandbox to run code and commands in, and answer its id (sb-…). It is killed \
        when this MCP session ends unless persist is true. Choose the isolation tier, template, network allowlist \
        and timeout; give it a name to refer to it as sandbox: \"NAME\".")]
    async fn create_sandbox(
        &self,
        Extension(parts): Extension<Parts>,
        Parameters(args): Parameters<CreateSandboxArgs>,
    ) -> CallToolResult {
        answer(self.create(&parts, args).await)
    }

    /// `kill_sandbox`.
    #[tool(description = "Kill a sandbox (by id or this session's name for it); everything in it is gone.")]
    async fn kill_sandbox(
        &self,
        Extension(parts): Extension<Parts>,
        Parameters(args): Parameters<KillSandboxArgs>,
    ) -> CallToolResult {
        answer(self.kill_named(&parts, args.sandbox).await)
    }
}

impl SandboxTools {
    async fn create(&self, parts: &Parts, args: CreateSandboxArgs) -> Result<CallToolResult, ApiError> {
        let caller = Caller::of(parts)?;
        if let Some(name) = &args.name {
            check_name(name)?;
            let session = caller.session.as_deref().unwrap_or_default();
            if let Some(id) = self.state.mcp_sessions().named(session, name) {
                return Err(ApiError::conflict(format!(
                    "this session already has a sandbox named {name:?} ({id}); use it, or kill_sandbox it first"
                )));
            }
        }
        let request = CreateSandboxRequest {
            isolation: args.isolation,
            template: args.template,
            network: args.network,
            timeout_s: args.timeout_s,
            ..CreateSandboxRequest::default()
        };
        let sandbox = self.create_owned(&caller, request, args.persist, args.name.as_deref()).await?;
        let lifetime = match args.persist {
            true => "it persists after this session ends (kill it with kill_sandbox)",
            false => "it is killed when this session ends",
        };
        let text = format!(
            "sandbox {} created (isolation {}, expires {}); {lifetime}",
            sandbox.id, sandbox.isolation, sandbox.expires_at
        );
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
    }

    async fn kill_named(&self, parts: &Parts, sandbox: String) -> Result<CallToolResult, ApiError> {
        let caller = Caller::of(parts)?;
        let id = self.existing(&caller, sandbox)?;
        self.kill(&caller, &id).await?;
        Ok(CallToolResult::success(vec![ContentBlock::text(format!("sandbox {id} killed"))]))
    }
}
