//! What a scan reports: findings (rule, severity, 1-based line and column, a one-line explanation the model can act
//! on), the language scanned, and the verdict a policy draws from them.

use serde::{Deserialize, Serialize};

/// How bad a finding is; a policy's `block` list names the severities that refuse code in `enforce` mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Worth knowing, never harmful by itself.
    Info,
    /// Unusual for generated code.
    Low,
    /// Often legitimate, often abused (a process call, an off-policy import).
    Medium,
    /// Rarely legitimate in generated code (eval of data, a raw socket, a write under /etc).
    High,
    /// Hostile on its face (a fork bomb, `rm -rf /`, base64-decoded exec, a reverse shell).
    Critical,
}

impl Severity {
    /// The severity's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Low => "low",
            Severity::Medium => "medium",
            Severity::High => "high",
            Severity::Critical => "critical",
        }
    }
}

/// A language the scanner reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ScanLanguage {
    /// Python 3.
    Python,
    /// JavaScript (Node), also accepted as `node`.
    #[serde(alias = "node")]
    Javascript,
    /// Bash (also a command line passed to `/bin/bash -c`).
    Bash,
}

impl ScanLanguage {
    /// The language's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ScanLanguage::Python => "python",
            ScanLanguage::Javascript => "javascript",
            ScanLanguage::Bash => "bash",
        }
    }

    /// The language of a file name's extension (`.py`, `.js`/`.mjs`/`.cjs`, `.sh`/`.bash`).
    pub fn from_extension(extension: &str) -> Option<ScanLanguage> {
        match extension {
            "py" => Some(ScanLanguage::Python),
            "js" | "mjs" | "cjs" => Some(ScanLanguage::Javascript),
            "sh" | "bash" => Some(ScanLanguage::Bash),
            _ => None,
        }
    }
}

/// One thing the scan found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Finding {
    /// Stable rule id (`process_exec`, `import_not_allowed`, `scan_incomplete`, ...).
    pub rule: String,
    /// How bad it is.
    pub severity: Severity,
    /// Line of the code it points at, from 1.
    pub line: u32,
    /// Column (in characters) of the code it points at, from 1.
    pub column: u32,
    /// One line: what was found and what to do instead.
    pub message: String,
}

/// What a policy makes of a scan's findings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The code may run: nothing was found, or the policy's mode is `off`.
    Allow,
    /// The code may run, and the findings go with its result (mode `warn`, or `enforce` with nothing blocking).
    Warn,
    /// The code is refused before anything starts (mode `enforce` and a finding of a blocking severity).
    Block,
}

impl Verdict {
    /// The verdict's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Warn => "warn",
            Verdict::Block => "block",
        }
    }
}

/// A scan's answer: its findings (in the order of the code) and the verdict of the policy it was scanned under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScanReport {
    /// What was found.
    pub findings: Vec<Finding>,
    /// What the policy makes of it.
    pub verdict: Verdict,
}

impl ScanReport {
    /// The findings of a blocking severity under `policy` (what an `enforce` refusal names).
    pub fn blocking<'a>(&'a self, policy: &'a crate::ScanPolicy) -> impl Iterator<Item = &'a Finding> + 'a {
        self.findings.iter().filter(|f| policy.blocks(f.severity))
    }

    /// One line per finding (`line:column severity rule: message`), for a terminal.
    pub fn render_text(&self) -> String {
        let mut text = String::new();
        for f in &self.findings {
            text.push_str(&format!("{}:{} {} {}: {}\n", f.line, f.column, f.severity.as_str(), f.rule, f.message));
        }
        text
    }
}
