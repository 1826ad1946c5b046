//! The stateful code interpreter's vocabulary: languages, contexts, and what one cell answers (captured output, rich
//! results as Jupyter-style mime bundles, a structured error, an execution count).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A language a code context runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CodeLanguage {
    /// Python 3 (`python3` in the sandbox).
    Python,
    /// JavaScript (`node` in the sandbox).
    Javascript,
    /// Bash (`bash` in the sandbox, driven by `python3`): a cell is a script sourced by one long-running shell.
    Bash,
    /// TypeScript: the JavaScript kernel, each cell transpiled by the `typescript` package the sandbox has (types
    /// are not checked, as a REPL's).
    Typescript,
    /// Java: one JVM whose cells the JDK's `jdk.jshell` API evaluates (the sandbox needs a JDK: `java` with the
    /// `jdk.jshell` module).
    Java,
    /// R: one R session (`R` in the sandbox, driven by `python3`) whose global environment persists across cells.
    R,
}

impl CodeLanguage {
    /// The name used in the API (`python`, `javascript`, `bash`, `typescript`, `java`, `r`).
    pub fn as_str(self) -> &'static str {
        match self {
            CodeLanguage::Python => "python",
            CodeLanguage::Javascript => "javascript",
            CodeLanguage::Bash => "bash",
            CodeLanguage::Typescript => "typescript",
            CodeLanguage::Java => "java",
            CodeLanguage::R => "r",
        }
    }
}

/// A code context: one interpreter whose state persists across cells.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ContextInfo {
    /// `ctx-` + 16 hex digits.
    pub id: String,
    /// Its language.
    pub language: CodeLanguage,
    /// True for the context a language's cells use when they name none.
    pub default: bool,
    /// Cells run so far (since the last restart).
    pub execution_count: u64,
    /// The interpreter's working directory; absent: the sandbox's default working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// One rich result of a cell, as a mime bundle. `text/plain` is always there for the last expression's value.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct CellResult {
    /// `repr()` (Python) or `util.inspect` (JavaScript) of the value.
    #[serde(rename = "text/plain", default, skip_serializing_if = "Option::is_none")]
    pub text_plain: Option<String>,
    /// HTML (`_repr_html_`, e.g. a pandas DataFrame).
    #[serde(rename = "text/html", default, skip_serializing_if = "Option::is_none")]
    pub text_html: Option<String>,
    /// A PNG image, standard base64 (a matplotlib figure, `_repr_png_`).
    #[serde(rename = "image/png", default, skip_serializing_if = "Option::is_none")]
    pub image_png: Option<String>,
    /// An SVG image (`_repr_svg_`).
    #[serde(rename = "image/svg+xml", default, skip_serializing_if = "Option::is_none")]
    pub image_svg: Option<String>,
    /// Markdown (`_repr_markdown_`, IPython's `Markdown`).
    #[serde(rename = "text/markdown", default, skip_serializing_if = "Option::is_none")]
    pub text_markdown: Option<String>,
    /// LaTeX (`_repr_latex_`).
    #[serde(rename = "text/latex", default, skip_serializing_if = "Option::is_none")]
    pub text_latex: Option<String>,
    /// A JPEG image, standard base64 (`_repr_jpeg_`).
    #[serde(rename = "image/jpeg", default, skip_serializing_if = "Option::is_none")]
    pub image_jpeg: Option<String>,
    /// JSON data (`_repr_json_`, IPython's `JSON`).
    #[serde(rename = "application/json", default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Value>")]
    pub application_json: Option<serde_json::Value>,
    /// A matplotlib figure's structured data (`type` line, scatter, bar, pie, box_and_whisker or superchart, its
    /// `title`, axis labels and `elements`), as the `e2b-code-interpreter` SDK reads `result.chart`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Value>")]
    pub chart: Option<serde_json::Value>,
    /// True for the value of the cell's last expression; false for figures, `display()` calls and other side
    /// results.
    #[serde(default)]
    pub is_main_result: bool,
}

/// The error a cell raised.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct CellError {
    /// The exception's class (`ZeroDivisionError`, `KeyboardInterrupt`, `TypeError`, `TimeoutError`, …).
    pub name: String,
    /// Its message.
    pub value: String,
    /// Traceback lines (the kernel's own frames left out).
    #[serde(default)]
    pub traceback: Vec<String>,
}

/// What one cell answered.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct CellOutcome {
    /// The context the cell ran in.
    pub context_id: String,
    /// The context's cell counter after this cell (1 for the first cell after a start or restart).
    pub execution_count: u64,
    /// What the cell wrote to standard output (UTF-8, invalid bytes replaced).
    pub stdout: String,
    /// What the cell wrote to standard error.
    pub stderr: String,
    /// True when `stdout` or `stderr` was cut at the output limit.
    pub output_truncated: bool,
    /// Rich results: figures the cell left open, then the last expression's value.
    pub results: Vec<CellResult>,
    /// The error the cell raised, if any.
    pub error: Option<CellError>,
    /// True when the context had to be restarted (the cell could not be interrupted, or the interpreter died):
    /// its variables are gone.
    pub context_restarted: bool,
}

/// One cell to run, as the server hands it to the runtime.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct CodeRun {
    /// The language; may be omitted when `context_id` is given.
    pub language: Option<CodeLanguage>,
    /// The source of the cell.
    pub code: String,
    /// The context to run in; the language's default context (created on first use) when omitted.
    pub context_id: Option<String>,
    /// When to interrupt the cell, in milliseconds.
    pub timeout_ms: u64,
    /// Most bytes kept per output stream.
    pub max_output_bytes: u64,
    /// Environment variables for this cell only: set in the interpreter before it runs, put back as they were
    /// (or removed) after it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}
