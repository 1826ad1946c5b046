//! The `read_file`, `write_file` and `list_files` tools, in a sandbox named by id or by this session's name for it.

use std::fmt::Write;

use axum::http::request::Parts;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::{tool, tool_router};
use serde::Deserialize;

use crate::api::error::ApiError;
use crate::api::files::{list_entries, read_bytes, write_bytes};
use crate::mcp::handler::{Caller, SandboxTools, answer};

/// Arguments of `read_file`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadFileArgs {
    /// The sandbox: its id (sb-…) or this session's name for it.
    sandbox: String,
    /// Absolute path, e.g. `/workspace/out.txt`.
    path: String,
}

/// Arguments of `write_file`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WriteFileArgs {
    /// The sandbox: its id (sb-…) or this session's name for it.
    sandbox: String,
    /// Absolute path; the file is created or replaced (its directory must exist).
    path: String,
    /// The file's content: text, or standard base64 when `base64` is true.
    content: String,
    /// `content` is base64 (for binary files).
    #[serde(default)]
    base64: bool,
}

/// Arguments of `list_files`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListFilesArgs {
    /// The sandbox: its id (sb-…) or this session's name for it.
    sandbox: String,
    /// Absolute path of a directory; default `/workspace`.
    #[serde(default)]
    path: Option<String>,
}

const PNG_MAGIC: &[u8] = b"\x89PNG\r\n\x1a\n";

#[tool_router(router = file_tools, vis = "pub(super)")]
impl SandboxTools {
    /// `read_file`.
    #[tool(description = "Read a file from a sandbox: text as text, a PNG as an image, other binary as base64.")]
    async fn read_file(
        &self,
        Extension(parts): Extension<Parts>,
        Parameters(args): Parameters<ReadFileArgs>,
    ) -> CallToolResult {
        answer(self.read(&parts, args).await)
    }

    /// `write_file`.
    #[tool(description = "Write a file in a sandbox (created or replaced); binary content as base64 with \
        base64: true.")]
    async fn write_file(
        &self,
        Extension(parts): Extension<Parts>,
        Parameters(args): Parameters<WriteFileArgs>,
    ) -> CallToolResult {
        answer(self.write(&parts, args).await)
    }

    /// `list_files`.
    #[tool(description = "List a directory of a sandbox (default /workspace): one line per entry with its kind \
        and size.")]
    async fn list_files(
        &self,
        Extension(parts): Extension<Parts>,
        Parameters(args): Parameters<ListFilesArgs>,
    ) -> CallToolResult {
        answer(self.list(&parts, args).await)
    }
}

impl SandboxTools {
    async fn read(&self, parts: &Parts, args: ReadFileArgs) -> Result<CallToolResult, ApiError> {
        let caller = Caller::of(parts)?;
        let id = self.existing(&caller, args.sandbox)?;
        let data = read_bytes(&self.state, &caller.tenant, &id, &args.path).await?;
        let block = if data.starts_with(PNG_MAGIC) {
            ContentBlock::image(STANDARD.encode(&data), "image/png")
        } else {
            match String::from_utf8(data) {
                Ok(text) => ContentBlock::text(text),
                Err(binary) => ContentBlock::text(format!(
                    "(binary, {} bytes, base64)\n{}",
                    binary.as_bytes().len(),
                    STANDARD.encode(binary.as_bytes())
                )),
            }
        };
        Ok(CallToolResult::success(vec![block]))
    }

    async fn write(&self, parts: &Parts, args: WriteFileArgs) -> Result<CallToolResult, ApiError> {
        let caller = Caller::of(parts)?;
        let id = self.existing(&caller, args.sandbox)?;
        let data = match args.base64 {
            true => STANDARD
                .decode(args.content.as_bytes())
                .map_err(|error| ApiError::unprocessable(format!("content is not standard base64: {error}")))?,
            false => args.content.into_bytes(),
        };
        let size = data.len();
        write_bytes(&self.state, &caller.tenant, &id, &args.path, data).await?;
        Ok(CallToolResult::success(vec![ContentBlock::text(format!("wrote {size} bytes to {} in {id}", args.path))]))
    }

    async fn list(&self, parts: &Parts, args: ListFilesArgs) -> Result<CallToolResult, ApiError> {
        let caller = Caller::of(parts)?;
        let id = self.existing(&caller, args.sandbox)?;
        let path = args.path.unwrap_or_else(|| "/workspace".to_owned());
        let list = list_entries(&self.state, &caller.tenant, &id, &path).await?;
        let mut text = format!("{path} in {id}: {} entries\n", list.entries.len());
        for entry in &list.entries {
            let kind = serde_json::to_value(entry.kind).ok().and_then(|v| v.as_str().map(str::to_owned));
            writeln!(text, "{} {} {}", kind.as_deref().unwrap_or("?"), entry.size, entry.name).ok();
        }
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
    }
}
