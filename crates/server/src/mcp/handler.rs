//! The MCP server handler: one per session, holding the server's state; its tools are the routers of the `tools_*`
//! files added together (a new tool is one `#[tool]` fn in a `#[tool_router(router = …)]` block and one `+` here).
//! Every tool acts as the caller: the tenant the middleware authenticated, and the session the request names.

use std::borrow::Cow;

use axum::http::request::Parts;
use rmcp::ServerHandler;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ProtocolVersion, ServerCapabilities, ServerConfig};
use rmcp::tool_handler;

use crate::api::error::ApiError;
use crate::api::extract::JsonBody;
use crate::api::sandboxes;
use crate::api::schemas::CreateSandboxRequest;
use crate::auth::Tenant;
use crate::ids::is_sandbox_id;
use crate::state::AppState;

/// Tools over the server's own service layer (no HTTP to itself).
#[derive(Clone)]
pub(crate) struct SandboxTools {
    pub(super) state: AppState,
    tool_router: ToolRouter<SandboxTools>,
}

impl SandboxTools {
    /// The handler of a new session.
    pub(crate) fn new(state: AppState) -> Self {
        let tool_router = Self::lifecycle_tools() + Self::run_tools() + Self::file_tools() + Self::scan_tools();
        SandboxTools { state, tool_router }
    }
}

const INSTRUCTIONS: &str = "Run untrusted code in isolated sandboxes. run_code and exec without `sandbox` use a \
    fresh sandbox that is killed afterwards; with `sandbox: \"NAME\"` they use this session's sandbox of that name \
    (created on first use, so files and variables persist across calls); with a sandbox id (sb-…) from \
    create_sandbox they use that one. Sandboxes this session creates are killed when the session ends, unless \
    created with persist: true.";

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SandboxTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("sandkasten", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    // Sandboxes belong to a session, and sessions are gone from the 2026-07-28 revision on (each request stands
    // alone there): offer the revisions that have them, so clients take the initialize handshake.
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2025_11_25))
    }
}

/// Who calls a tool: the authenticated tenant, and the MCP session of the request (none before `initialize`).
pub(super) struct Caller {
    pub(super) tenant: Tenant,
    pub(super) session: Option<String>,
}

impl Caller {
    /// The caller of the request whose HTTP parts these are.
    pub(super) fn of(parts: &Parts) -> Result<Caller, ApiError> {
        let tenant =
            parts.extensions.get::<Tenant>().cloned().ok_or_else(|| ApiError::unauthorized("missing API key"))?;
        let session = parts.headers.get("mcp-session-id").and_then(|value| value.to_str().ok()).map(str::to_owned);
        Ok(Caller { tenant, session })
    }
}

/// How a tool names the sandbox to use.
pub(super) enum Target {
    /// A fresh sandbox, killed after the call.
    OneShot,
    /// A sandbox id.
    Id(String),
    /// This session's sandbox of this name.
    Named(String),
}

impl Target {
    /// `sandbox` as given: absent, an id (`sb-…`), or a session sandbox name.
    pub(super) fn parse(sandbox: Option<String>) -> Result<Target, ApiError> {
        let Some(sandbox) = sandbox else { return Ok(Target::OneShot) };
        if is_sandbox_id(&sandbox) {
            return Ok(Target::Id(sandbox));
        }
        check_name(&sandbox)?;
        Ok(Target::Named(sandbox))
    }
}

/// A session sandbox name: 1 to 64 of `A-Z a-z 0-9 _ . -`, and not an id.
pub(super) fn check_name(name: &str) -> Result<(), ApiError> {
    let fits = (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        && !name.starts_with("sb-");
    match fits {
        true => Ok(()),
        false => Err(ApiError::unprocessable(format!(
            "sandbox {name:?} is neither a sandbox id (sb-…) nor a name (1 to 64 of A-Z a-z 0-9 _ . -, not \
             starting with sb-)"
        ))),
    }
}

impl SandboxTools {
    /// Creates a sandbox for `caller` and records it as its session's (`persist` keeps it past the session).
    pub(super) async fn create_owned(
        &self,
        caller: &Caller,
        request: CreateSandboxRequest,
        persist: bool,
        name: Option<&str>,
    ) -> Result<crate::api::schemas::SandboxBody, ApiError> {
        let state = axum::extract::State(self.state.clone());
        let (_, axum::Json(sandbox)) = sandboxes::create(state, caller.tenant.clone(), JsonBody(request)).await?;
        let adopted = caller
            .session
            .as_deref()
            .is_some_and(|session| self.state.mcp_sessions().adopt(session, &sandbox.id, persist, name));
        if !adopted && !persist {
            // No session to end it (it has ended meanwhile, or there never was one): do not leave it behind.
            self.kill(caller, &sandbox.id).await?;
            return Err(ApiError::conflict(
                "this MCP session has ended (or was never initialized), so a sandbox it creates would have no owner; \
                 open a new session, or create it with persist: true",
            ));
        }
        Ok(sandbox)
    }

    /// Kills the caller's sandbox `id` and forgets it in the caller's session.
    pub(super) async fn kill(&self, caller: &Caller, id: &str) -> Result<(), ApiError> {
        let state = axum::extract::State(self.state.clone());
        sandboxes::delete(state, caller.tenant.clone(), crate::api::extract::IdPath(id.to_owned())).await?;
        if let Some(session) = &caller.session {
            self.state.mcp_sessions().forget(session, id);
        }
        Ok(())
    }

    /// The id of the sandbox `target` names, creating a session sandbox of that name on first use. The bool is
    /// true for a one-shot sandbox (the caller kills it when done).
    pub(super) async fn resolve(&self, caller: &Caller, target: Target) -> Result<(String, bool), ApiError> {
        match target {
            Target::Id(id) => Ok((id, false)),
            Target::Named(name) => {
                let session = caller.session.as_deref().unwrap_or_default();
                if let Some(id) = self.state.mcp_sessions().named(session, &name) {
                    return Ok((id, false));
                }
                let sandbox = self.create_owned(caller, CreateSandboxRequest::default(), false, Some(&name)).await?;
                Ok((sandbox.id, false))
            }
            Target::OneShot => {
                let sandbox = self.create_owned(caller, CreateSandboxRequest::default(), false, None).await?;
                Ok((sandbox.id, true))
            }
        }
    }

    /// The id of the sandbox `sandbox` names, which must exist (file tools never create one).
    pub(super) fn existing(&self, caller: &Caller, sandbox: String) -> Result<String, ApiError> {
        match Target::parse(Some(sandbox))? {
            Target::Id(id) => Ok(id),
            Target::Named(name) => {
                let session = caller.session.as_deref().unwrap_or_default();
                self.state.mcp_sessions().named(session, &name).ok_or_else(|| {
                    ApiError::not_found(format!(
                        "this session has no sandbox named {name:?}: run_code or exec with sandbox: {name:?} \
                         creates it, or give a sandbox id"
                    ))
                })
            }
            Target::OneShot => Err(ApiError::unprocessable("name the sandbox")),
        }
    }
}

/// An API error as an MCP tool error (the model reads the message; `code` says which kind).
pub(super) fn tool_error(error: ApiError) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!("{}: {}", error.code.as_str(), error.message))])
}

/// A tool's outcome as its MCP result.
pub(super) fn answer(result: Result<CallToolResult, ApiError>) -> CallToolResult {
    result.unwrap_or_else(tool_error)
}
