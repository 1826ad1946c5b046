//! Rules as data: a [`Rule`] is an id, a severity and the explanation a finding carries. The rules every language
//! shares (imports against the policy, the scan's own bounds) are here; each language's file has its own table.

use crate::finding::Severity;

/// One rule: what a finding of it is called, how bad it is, and what the model should do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// Stable id, the `rule` of its findings.
    pub id: &'static str,
    /// The severity of its findings.
    pub severity: Severity,
    /// One line, said after what was found: why it matters and what to do instead.
    pub explanation: &'static str,
}

/// The scan stopped at one of its bounds (deadline, tree size, findings); what it did not read was not checked.
pub const SCAN_INCOMPLETE: Rule = Rule {
    id: "scan_incomplete",
    severity: Severity::High,
    explanation: "the scan stopped before the end of the code, so the rest was not checked; send smaller, simpler code",
};

/// An import of a module on the policy's `deny_imports`.
pub const IMPORT_DENIED: Rule = Rule {
    id: "import_denied",
    severity: Severity::High,
    explanation: "this module is on the policy's deny_imports; do the task without it",
};

/// An import of a module not on the policy's `allow_imports`.
pub const IMPORT_NOT_ALLOWED: Rule = Rule {
    id: "import_not_allowed",
    severity: Severity::High,
    explanation: "this module is not on the policy's allow_imports; use only the allowed modules",
};

/// An import whose module is computed at run time (cannot be checked against the policy).
pub const DYNAMIC_IMPORT: Rule = Rule {
    id: "dynamic_import",
    severity: Severity::Medium,
    explanation: "the module name is computed at run time, so it cannot be checked; import it by its literal name",
};

/// A dynamic import under a policy with an allowlist: nothing can show the module is on it.
pub const DYNAMIC_IMPORT_UNCHECKED: Rule = Rule {
    id: "dynamic_import",
    severity: Severity::High,
    explanation: "the module name is computed at run time, so it cannot be checked against allow_imports; import it \
                  by its literal name",
};

/// A write, removal or permission change under /etc, /proc, /sys, /dev, ~/.ssh, ... (each language finds its own
/// ways of writing: redirections and `dd` in bash, `open(..., "w")` in Python, `fs.writeFile` in JavaScript).
pub const SENSITIVE_PATH_WRITE: Rule = Rule {
    id: "sensitive_path_write",
    severity: Severity::High,
    explanation: "system and credential paths are off limits; write under /workspace or /tmp instead",
};

/// The rules shared by every language, for listing.
pub const SHARED_RULES: &[&Rule] =
    &[&SCAN_INCOMPLETE, &IMPORT_DENIED, &IMPORT_NOT_ALLOWED, &DYNAMIC_IMPORT, &SENSITIVE_PATH_WRITE];

/// Paths under which writes are findings (`~` is the home directory).
pub const SENSITIVE_PATHS: &[&str] = &[
    "/etc",
    "/proc",
    "/sys",
    "/dev",
    "/boot",
    "/root",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/usr",
    "/var/run",
    "/run",
    "~/.ssh",
    "~/.bashrc",
    "~/.profile",
    "~/.bash_profile",
    "~/.config/autostart",
    "$HOME/.ssh",
    "$HOME/.bashrc",
];

/// Paths under those that are harmless to write.
const HARMLESS_PATHS: &[&str] = &["/dev/null", "/dev/stdout", "/dev/stderr", "/dev/shm", "/dev/fd/", "/proc/self/fd/"];

/// Whether a literal path is under a sensitive directory (and not one of the harmless device files).
pub fn is_sensitive_path(path: &str) -> bool {
    let path = path.trim();
    if HARMLESS_PATHS.iter().any(|p| path.starts_with(p)) {
        return false;
    }
    let under = |p: &&str| path.strip_prefix(*p).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
    SENSITIVE_PATHS.iter().any(under) || (path.starts_with("/home/") && path.contains("/.ssh"))
}
