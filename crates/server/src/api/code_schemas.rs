//! Request and response bodies of the code-interpreter routes (`/code`, `/contexts`), with their OpenAPI schemas.
//! They mirror `sandkasten_types::{CodeLanguage, ContextInfo, CellResult, CellError, CellOutcome}` (same JSON);
//! tests check each mirror against its original.

use std::collections::BTreeMap;

use sandkasten_scan::{Finding, ScanPolicyOverride};
use sandkasten_types::{CellError, CellOutcome, CellResult, CodeLanguage, ContextInfo};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use sandkasten_types::Isolation;

/// A code context's language. Mirrors `sandkasten_types::CodeLanguage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LanguageName {
    /// Python 3 (`python3` in the sandbox).
    Python,
    /// JavaScript (`node` in the sandbox).
    Javascript,
    /// Bash (`bash` in the sandbox, driven by `python3`): a cell is a script sourced by one long-running shell;
    /// a non-zero exit status is the cell's error.
    Bash,
    /// TypeScript: the JavaScript kernel, each cell transpiled (not type-checked) by the sandbox's `typescript`
    /// package (Debian's `node-typescript`, or npm's global one).
    Typescript,
    /// Java: the JDK's `jdk.jshell` API in one JVM (the sandbox needs a JDK); declarations, imports and classes
    /// persist, a cell ending in an expression has its value as the result.
    Java,
    /// R: one R session (the sandbox needs R); the global environment persists, a cell ending in a visible value
    /// has it as the result, printed as the R console prints it (`[1] 42`).
    R,
}

impl From<LanguageName> for CodeLanguage {
    fn from(language: LanguageName) -> Self {
        match language {
            LanguageName::Python => CodeLanguage::Python,
            LanguageName::Javascript => CodeLanguage::Javascript,
            LanguageName::Bash => CodeLanguage::Bash,
            LanguageName::Typescript => CodeLanguage::Typescript,
            LanguageName::Java => CodeLanguage::Java,
            LanguageName::R => CodeLanguage::R,
        }
    }
}

impl From<CodeLanguage> for LanguageName {
    fn from(language: CodeLanguage) -> Self {
        match language {
            CodeLanguage::Python => LanguageName::Python,
            CodeLanguage::Javascript => LanguageName::Javascript,
            CodeLanguage::Bash => LanguageName::Bash,
            CodeLanguage::Typescript => LanguageName::Typescript,
            CodeLanguage::Java => LanguageName::Java,
            CodeLanguage::R => LanguageName::R,
        }
    }
}

/// `POST /v1/sandboxes/{id}/code`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CodeBody {
    /// The language; required unless `context_id` is given (then it must match the context's).
    #[serde(default)]
    pub language: Option<LanguageName>,
    /// The cell's source. The value of its last expression is returned.
    #[schema(example = "x = 41\nx + 1")]
    pub code: String,
    /// The context to run in; default: the language's default context, created on first use.
    #[serde(default)]
    pub context_id: Option<String>,
    /// When to interrupt the cell (KeyboardInterrupt in Python), in milliseconds; default and maximum: the
    /// sandbox's `limits.timeout_ms`.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Changes to the tenant's scan policy for this cell (scanned in the cell's language); they may only tighten
    /// it (a loosening field is 422).
    #[serde(default)]
    pub scan_policy: Option<ScanPolicyOverride>,
    /// Environment variables for this cell only: set in the interpreter before the cell runs, put back as they were
    /// (or removed) after it. POSIX names; invalid ones are 422.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// One rich result of a cell, as a mime bundle. Mirrors `sandkasten_types::CellResult`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct CellResultBody {
    /// `repr()` (Python) or `util.inspect` (JavaScript) of the value.
    #[serde(rename = "text/plain", skip_serializing_if = "Option::is_none")]
    pub text_plain: Option<String>,
    /// HTML (`_repr_html_`, e.g. a pandas DataFrame).
    #[serde(rename = "text/html", skip_serializing_if = "Option::is_none")]
    pub text_html: Option<String>,
    /// A PNG image in standard base64 (a matplotlib figure, `_repr_png_`).
    #[serde(rename = "image/png", skip_serializing_if = "Option::is_none")]
    pub image_png: Option<String>,
    /// An SVG image (`_repr_svg_`).
    #[serde(rename = "image/svg+xml", skip_serializing_if = "Option::is_none")]
    pub image_svg: Option<String>,
    /// Markdown (`_repr_markdown_`).
    #[serde(rename = "text/markdown", skip_serializing_if = "Option::is_none")]
    pub text_markdown: Option<String>,
    /// LaTeX (`_repr_latex_`).
    #[serde(rename = "text/latex", skip_serializing_if = "Option::is_none")]
    pub text_latex: Option<String>,
    /// A JPEG image in standard base64 (`_repr_jpeg_`).
    #[serde(rename = "image/jpeg", skip_serializing_if = "Option::is_none")]
    pub image_jpeg: Option<String>,
    /// JSON data (`_repr_json_`).
    #[serde(rename = "application/json", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub application_json: Option<serde_json::Value>,
    /// A matplotlib figure's structured data (`type` line, scatter, bar, pie, box_and_whisker or superchart,
    /// `title`, axis labels, `elements`), as E2B's `result.chart`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub chart: Option<serde_json::Value>,
    /// True for the value of the cell's last expression; false for figures and other side results.
    pub is_main_result: bool,
}

impl From<CellResult> for CellResultBody {
    fn from(r: CellResult) -> Self {
        CellResultBody {
            text_plain: r.text_plain,
            text_html: r.text_html,
            image_png: r.image_png,
            image_svg: r.image_svg,
            text_markdown: r.text_markdown,
            text_latex: r.text_latex,
            image_jpeg: r.image_jpeg,
            application_json: r.application_json,
            chart: r.chart,
            is_main_result: r.is_main_result,
        }
    }
}

/// The error a cell raised. Mirrors `sandkasten_types::CellError`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct CellErrorBody {
    /// The exception's class: `ZeroDivisionError`, `KeyboardInterrupt` (interrupted at its timeout), `TypeError`,
    /// `TimeoutError`, `KernelRestarted` (the interpreter was lost and restarted) …
    #[schema(example = "ZeroDivisionError")]
    pub name: String,
    /// Its message.
    pub value: String,
    /// Traceback lines (the kernel's own frames left out).
    pub traceback: Vec<String>,
}

impl From<CellError> for CellErrorBody {
    fn from(e: CellError) -> Self {
        CellErrorBody { name: e.name, value: e.value, traceback: e.traceback }
    }
}

/// What one cell answered (also the data of the final `end` event of a code stream).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CodeResponse {
    /// The sandbox.
    pub sandbox_id: String,
    /// The isolation of the sandbox: its tier, why, and (microVM) `accel`.
    pub isolation: Isolation,
    /// The context the cell ran in.
    #[schema(example = "ctx-3f9a0c27e1d4b658")]
    pub context_id: String,
    /// The context's cell counter after this cell (1 for the first cell after a start or restart).
    pub execution_count: u64,
    /// What the cell wrote to standard output.
    pub stdout: String,
    /// What the cell wrote to standard error.
    pub stderr: String,
    /// True when stdout or stderr was cut at the sandbox's output limit.
    pub output_truncated: bool,
    /// Rich results: figures the cell left open, then the last expression's value (`is_main_result`).
    pub results: Vec<CellResultBody>,
    /// The error the cell raised, or null.
    #[schema(required = true)]
    pub error: Option<CellErrorBody>,
    /// True when the context's interpreter had to be restarted (its variables are gone).
    pub context_restarted: bool,
    /// Wall-clock time of the call, in milliseconds.
    pub duration_ms: f64,
    /// What the static scan found before the cell ran (the tenant's scan policy in mode `warn`, or `enforce` with
    /// nothing blocking); absent when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<Finding>,
}

impl CodeResponse {
    /// The response for `outcome` in sandbox `sandbox_id`, which runs on tier `isolation`.
    pub fn new(sandbox_id: String, isolation: Isolation, outcome: CellOutcome, duration_ms: f64) -> Self {
        CodeResponse {
            sandbox_id,
            isolation,
            context_id: outcome.context_id,
            execution_count: outcome.execution_count,
            stdout: outcome.stdout,
            stderr: outcome.stderr,
            output_truncated: outcome.output_truncated,
            results: outcome.results.into_iter().map(CellResultBody::from).collect(),
            error: outcome.error.map(CellErrorBody::from),
            context_restarted: outcome.context_restarted,
            duration_ms,
            findings: Vec::new(),
        }
    }
}

/// `POST /v1/sandboxes/{id}/contexts`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateContextBody {
    /// The context's language.
    pub language: LanguageName,
    /// The interpreter's working directory (absolute; it must exist); default: the sandbox's default working
    /// directory.
    #[serde(default)]
    pub cwd: Option<String>,
}

/// A code context. Mirrors `sandkasten_types::ContextInfo`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ContextBody {
    /// `ctx-` + 16 hex digits.
    #[schema(example = "ctx-3f9a0c27e1d4b658")]
    pub id: String,
    /// Its language.
    pub language: LanguageName,
    /// True for the context a language's cells use when they name none.
    pub default: bool,
    /// Cells run since the interpreter started.
    pub execution_count: u64,
    /// The interpreter's working directory; absent: the sandbox's default working directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

impl From<ContextInfo> for ContextBody {
    fn from(info: ContextInfo) -> Self {
        ContextBody {
            id: info.id,
            language: info.language.into(),
            default: info.default,
            execution_count: info.execution_count,
            cwd: info.cwd,
        }
    }
}

/// `GET /v1/sandboxes/{id}/contexts`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ContextList {
    /// The contexts, by id.
    pub contexts: Vec<ContextBody>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrors_have_the_same_json_as_the_types() -> Result<(), serde_json::Error> {
        let result = CellResult {
            text_plain: Some("42".into()),
            text_html: Some("<b>".into()),
            image_png: Some("iVBO".into()),
            image_svg: None,
            text_markdown: Some("**b**".into()),
            text_latex: None,
            image_jpeg: None,
            application_json: Some(serde_json::json!({"a": [1]})),
            chart: Some(serde_json::json!({"type": "pie", "title": null, "elements": []})),
            is_main_result: true,
        };
        assert_eq!(serde_json::to_value(CellResultBody::from(result.clone()))?, serde_json::to_value(&result)?);
        let error = CellError { name: "E".into(), value: "v".into(), traceback: vec!["t".into()] };
        assert_eq!(serde_json::to_value(CellErrorBody::from(error.clone()))?, serde_json::to_value(&error)?);
        for language in [
            CodeLanguage::Python,
            CodeLanguage::Javascript,
            CodeLanguage::Bash,
            CodeLanguage::Typescript,
            CodeLanguage::Java,
            CodeLanguage::R,
        ] {
            assert_eq!(serde_json::to_value(LanguageName::from(language))?, serde_json::to_value(language)?);
            for cwd in [None, Some("/home/user/work".to_owned())] {
                let info = ContextInfo { id: "ctx-1".into(), language, default: true, execution_count: 3, cwd };
                assert_eq!(serde_json::to_value(ContextBody::from(info.clone()))?, serde_json::to_value(&info)?);
            }
        }
        Ok(())
    }
}
