//! The scan policy (TOML): `mode`, the severities that block in `enforce`, and per-language `allow_imports` /
//! `deny_imports`; and the per-request override, which may only tighten a policy (raise the mode, block more
//! severities, add denies, narrow the allowlist) and names the field when it would loosen one.
//!
//! ```toml
//! mode = "enforce"                 # "off" (no scan before runs) | "warn" (run, report findings) | "enforce" (refuse)
//! block = ["high", "critical"]     # severities refused in enforce; default high and critical
//! [python]
//! allow_imports = ["numpy", "pandas", "json", "math"]   # set: every other import is a finding (os.path matches os)
//! deny_imports = ["subprocess", "ctypes"]               # always a finding
//! [javascript]
//! deny_imports = ["child_process"]                       # node:child_process matches too
//! ```

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::finding::{Finding, ScanLanguage, ScanReport, Severity, Verdict};

/// What the policy does before code runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// No scan before runs (`POST /v1/scan` still answers findings).
    #[default]
    Off,
    /// Scan; the code runs and its result carries the findings.
    Warn,
    /// Scan; code with a finding of a blocking severity is refused before anything starts.
    Enforce,
}

impl Mode {
    /// The mode's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Warn => "warn",
            Mode::Enforce => "enforce",
        }
    }
}

/// Which modules one language may import.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ImportPolicy {
    /// When set, every import of a module not on it (nor under one on it: `os.path` is under `os`) is a finding
    /// (`import_not_allowed`). Default: unset, every module may be imported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_imports: Option<Vec<String>>,
    /// Imports of these modules (or modules under them) are findings (`import_denied`). Default none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_imports: Vec<String>,
}

/// A scan policy: one per tenant (or the server's default), or a file given to `sandkasten run --policy`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ScanPolicy {
    /// `off`, `warn` or `enforce`.
    pub mode: Mode,
    /// Severities that refuse code in `enforce` mode. Default `["high", "critical"]`.
    #[serde(default = "default_block")]
    pub block: BTreeSet<Severity>,
    /// Python's imports.
    #[serde(default)]
    pub python: ImportPolicy,
    /// JavaScript's imports (`require`, `import`).
    #[serde(default)]
    pub javascript: ImportPolicy,
}

fn default_block() -> BTreeSet<Severity> {
    BTreeSet::from([Severity::High, Severity::Critical])
}

impl Default for ScanPolicy {
    /// Mode `off`, blocking high and critical, no import rules: what a server without `[scan]` has.
    fn default() -> Self {
        ScanPolicy {
            mode: Mode::Off,
            block: default_block(),
            python: ImportPolicy::default(),
            javascript: ImportPolicy::default(),
        }
    }
}

/// A policy that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// Not TOML, or not a policy (unknown key, wrong type, a misspelt mode).
    #[error("scan policy: {0}")]
    Toml(#[from] toml::de::Error),
    /// An empty module name in an import list.
    #[error("scan policy: {0} has an empty module name; remove it")]
    EmptyModule(String),
}

/// A request's changes to its tenant's policy; every field may only tighten it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ScanPolicyOverride {
    /// A mode at least as strict as the tenant's (`off` < `warn` < `enforce`).
    #[serde(default)]
    pub mode: Option<Mode>,
    /// Severities to block: must include every severity the tenant's policy blocks.
    #[serde(default)]
    pub block: Option<BTreeSet<Severity>>,
    /// Python: `allow_imports` within the tenant's allowlist, `deny_imports` added to the tenant's.
    #[serde(default)]
    pub python: Option<ImportPolicy>,
    /// JavaScript: as for Python.
    #[serde(default)]
    pub javascript: Option<ImportPolicy>,
}

/// An override that would loosen the tenant's policy: which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("scan_policy.{field}: {reason}")]
pub struct Loosening {
    /// The field's path (`mode`, `block`, `python.allow_imports`).
    pub field: String,
    /// What it would loosen and what is allowed instead.
    pub reason: String,
}

/// Whether `module` is `entry` or a module under it (`os.path` under `os`, `fs/promises` under `fs`).
pub fn module_matches(entry: &str, module: &str) -> bool {
    let (entry, module) = (normalize(entry), normalize(module));
    module == entry || module.strip_prefix(entry).is_some_and(|rest| rest.starts_with('.') || rest.starts_with('/'))
}

/// A module name as the policy compares it: Node's `node:` prefix dropped.
fn normalize(name: &str) -> &str {
    name.strip_prefix("node:").unwrap_or(name)
}

impl ImportPolicy {
    /// Whether the allowlist (if any) admits `module`.
    pub fn allows(&self, module: &str) -> bool {
        self.allow_imports.as_ref().is_none_or(|allow| allow.iter().any(|entry| module_matches(entry, module)))
    }

    /// Whether the denylist names `module` (or a module it is under).
    pub fn denies(&self, module: &str) -> bool {
        self.deny_imports.iter().any(|entry| module_matches(entry, module))
    }

    fn problems(&self, field: &str) -> Vec<PolicyError> {
        let empty = |list: &[String]| list.iter().any(|m| m.trim().is_empty());
        let mut problems = Vec::new();
        if self.allow_imports.as_deref().is_some_and(empty) {
            problems.push(PolicyError::EmptyModule(format!("{field}.allow_imports")));
        }
        if empty(&self.deny_imports) {
            problems.push(PolicyError::EmptyModule(format!("{field}.deny_imports")));
        }
        problems
    }

    fn tightened(&self, change: &ImportPolicy, field: &str) -> Result<ImportPolicy, Loosening> {
        let allow_imports = match (&self.allow_imports, &change.allow_imports) {
            (base, None) => base.clone(),
            (None, Some(narrower)) => Some(narrower.clone()),
            (Some(base), Some(narrower)) => {
                let outside: Vec<&str> = narrower
                    .iter()
                    .filter(|m| !base.iter().any(|entry| module_matches(entry, m)))
                    .map(String::as_str)
                    .collect();
                if !outside.is_empty() {
                    return Err(Loosening {
                        field: format!("{field}.allow_imports"),
                        reason: format!(
                            "{} not in the tenant's allow_imports ({}); a request may only narrow it",
                            outside.join(", "),
                            base.join(", ")
                        ),
                    });
                }
                Some(narrower.clone())
            }
        };
        let mut deny_imports = self.deny_imports.clone();
        deny_imports.extend(change.deny_imports.iter().filter(|m| !self.deny_imports.contains(m)).cloned());
        Ok(ImportPolicy { allow_imports, deny_imports })
    }
}

impl ScanPolicy {
    /// Reads a policy from TOML text.
    pub fn from_toml_str(text: &str) -> Result<ScanPolicy, PolicyError> {
        let policy: ScanPolicy = toml::from_str(text)?;
        policy.check()?;
        Ok(policy)
    }

    /// Checks what serde cannot (no empty module names).
    pub fn check(&self) -> Result<(), PolicyError> {
        self.problems().into_iter().next().map_or(Ok(()), Err)
    }

    /// Every problem of the policy (what [`ScanPolicy::check`] reports the first of).
    pub fn problems(&self) -> Vec<PolicyError> {
        let mut problems = self.python.problems("python");
        problems.extend(self.javascript.problems("javascript"));
        problems
    }

    /// The import rules of a language (bash has none: an empty policy).
    pub fn imports(&self, language: ScanLanguage) -> Option<&ImportPolicy> {
        match language {
            ScanLanguage::Python => Some(&self.python),
            ScanLanguage::Javascript => Some(&self.javascript),
            ScanLanguage::Bash => None,
        }
    }

    /// Whether a finding of this severity refuses code (in `enforce` mode).
    pub fn blocks(&self, severity: Severity) -> bool {
        self.block.contains(&severity)
    }

    /// The verdict on these findings.
    pub fn verdict(&self, findings: &[Finding]) -> Verdict {
        match self.mode {
            Mode::Off => Verdict::Allow,
            _ if findings.is_empty() => Verdict::Allow,
            Mode::Enforce if findings.iter().any(|f| self.blocks(f.severity)) => Verdict::Block,
            Mode::Warn | Mode::Enforce => Verdict::Warn,
        }
    }

    /// A report of findings under this policy.
    pub fn report(&self, findings: Vec<Finding>) -> ScanReport {
        let verdict = self.verdict(&findings);
        ScanReport { findings, verdict }
    }

    /// This policy tightened by a request's override, or the first field that would loosen it.
    pub fn tightened(&self, change: &ScanPolicyOverride) -> Result<ScanPolicy, Loosening> {
        let mode = match change.mode {
            Some(mode) if mode < self.mode => {
                return Err(Loosening {
                    field: "mode".into(),
                    reason: format!(
                        "\"{}\" is less strict than the tenant's \"{}\"; give \"{}\" or stricter, or leave it out",
                        mode.as_str(),
                        self.mode.as_str(),
                        self.mode.as_str()
                    ),
                });
            }
            Some(mode) => mode,
            None => self.mode,
        };
        let block = match &change.block {
            Some(block) => {
                let missing: Vec<&str> = self.block.difference(block).map(|s| s.as_str()).collect();
                if !missing.is_empty() {
                    return Err(Loosening {
                        field: "block".into(),
                        reason: format!(
                            "leaves out {}, which the tenant's policy blocks; a request may only add severities",
                            missing.join(", ")
                        ),
                    });
                }
                block.clone()
            }
            None => self.block.clone(),
        };
        let python = match &change.python {
            Some(change) => self.python.tightened(change, "python")?,
            None => self.python.clone(),
        };
        let javascript = match &change.javascript {
            Some(change) => self.javascript.tightened(change, "javascript")?,
            None => self.javascript.clone(),
        };
        Ok(ScanPolicy { mode, block, python, javascript })
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
