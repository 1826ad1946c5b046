//! The structured answer of one execution: output, exit status, which limit fired, phase timings, resource usage.

use base64::Engine as _;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::ErrorInfo;
use crate::isolation::Isolation;
use crate::limits::LimitKind;

/// Captured bytes of one output stream.
///
/// In JSON a stream is text when its bytes are text; binary bytes (not UTF-8, a NUL, many control characters) are
/// an empty text plus their exact bytes in base64, so nothing is lost and nothing is blown up by escapes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OutputStream {
    /// The bytes kept (at most the output limit).
    pub bytes: Vec<u8>,
    /// True when the program wrote more than was kept.
    pub truncated: bool,
}

impl OutputStream {
    /// The text form: lossless when the bytes are UTF-8.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    /// How the bytes go into JSON: text when they are text, else an empty string and the exact bytes in base64
    /// (see `utf8::is_text`), so a stream costs at most about twice its size as text and 4/3 as base64.
    pub fn json_forms(&self) -> (String, Option<String>) {
        json_forms(&self.bytes)
    }
}

/// `bytes` as JSON text, or as an empty text plus base64 when they are binary (`utf8::is_text`).
pub fn json_forms(bytes: &[u8]) -> (String, Option<String>) {
    if crate::utf8::is_text(bytes) {
        (String::from_utf8_lossy(bytes).into_owned(), None)
    } else {
        (String::new(), Some(base64::engine::general_purpose::STANDARD.encode(bytes)))
    }
}

/// Milliseconds from the request's arrival to the end of each phase (cumulative, so each is ≥ the one before). A
/// command in a sandbox that already existed has `allocate`, `vm_boot` and `filesystem_ready` 0.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PhaseTimings {
    /// The sandbox is there: its resources reserved (record written, cgroup created with its limits), or claimed from
    /// a warm pool (then about 0).
    pub allocate: f64,
    /// A microVM's guest kernel has booted (its agent's `GuestBooted` greeting arrived at the host; between
    /// `allocate` and `filesystem_ready`, so the VM's boot took `vm_boot - allocate`). 0 when no VM booted for this
    /// request: the other tiers, and a command in a sandbox that already existed.
    #[serde(default)]
    pub vm_boot: f64,
    /// Its root filesystem is built and its agent serves; the run's files (source, uploads) are written.
    pub filesystem_ready: f64,
    /// The command's jail is complete (ids, capabilities, landlock, seccomp) and its `execve` succeeded.
    pub runtime_ready: f64,
    /// The first byte of output arrived, or the program ended without output.
    pub first_command: f64,
}

/// Resources the sandbox consumed, read from its cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ResourceUsage {
    /// CPU time in user mode, all processes, in milliseconds.
    pub cpu_user_ms: u64,
    /// CPU time in kernel mode, all processes, in milliseconds.
    pub cpu_system_ms: u64,
    /// Highest memory use seen, in bytes.
    pub memory_peak_bytes: u64,
}

/// The result of one execution.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
pub struct ExecResult {
    /// The sandbox that ran it.
    pub sandbox_id: String,
    /// The tier it ran on, why, and (microVM) how its guest ran.
    #[serde(default)]
    pub isolation: Isolation,
    /// Exit code when the program exited normally.
    pub exit_code: Option<i32>,
    /// Signal number when the program was killed by a signal.
    pub signal: Option<i32>,
    /// Standard output as text; empty when it is binary (then `stdout_base64` has it).
    pub stdout: String,
    /// The exact stdout bytes in base64, present only when they are binary (not UTF-8, a NUL, many control
    /// characters).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub stdout_base64: Option<String>,
    /// Standard error as text; empty when it is binary (then `stderr_base64` has it).
    pub stderr: String,
    /// The exact stderr bytes in base64, present only when they are binary.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub stderr_base64: Option<String>,
    /// True when stdout went past the output limit and was cut.
    pub stdout_truncated: bool,
    /// True when stderr went past the output limit and was cut.
    pub stderr_truncated: bool,
    /// True when the wall-clock timeout killed the sandbox.
    pub timed_out: bool,
    /// True when the kernel's OOM killer killed a process of the sandbox.
    pub oom_killed: bool,
    /// The limit that fired, if any.
    pub limit: Option<LimitKind>,
    /// Wall-clock time from request to result, in milliseconds.
    pub duration_ms: f64,
    /// When each phase completed.
    pub phases: PhaseTimings,
    /// Resources consumed.
    pub usage: ResourceUsage,
    /// Set when the program could not run as asked (compile error, sandbox failure).
    pub error: Option<ErrorInfo>,
}

impl ExecResult {
    /// Stores both output streams in their JSON form.
    pub fn set_output(&mut self, stdout: &OutputStream, stderr: &OutputStream) {
        (self.stdout, self.stdout_base64) = stdout.json_forms();
        self.stdout_truncated = stdout.truncated;
        (self.stderr, self.stderr_base64) = stderr.json_forms();
        self.stderr_truncated = stderr.truncated;
    }
}

/// Serde helper: `Vec<u8>` as a base64 string.
pub(crate) mod base64_bytes {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        base64::engine::general_purpose::STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_output_is_kept_exactly_in_base64_and_only_there() {
        let stream = OutputStream { bytes: vec![b'a', 0xff, b'b'], truncated: false };
        assert_eq!(stream.json_forms(), (String::new(), Some("Yf9i".into())));
        let nul = OutputStream { bytes: vec![0; 3], truncated: false };
        assert_eq!(nul.json_forms(), (String::new(), Some("AAAA".into())), "never \\u0000 escapes");
        let utf8 = OutputStream { bytes: "grüß".as_bytes().to_vec(), truncated: false };
        assert_eq!(utf8.json_forms(), ("grüß".into(), None));
    }

    #[test]
    fn result_json_has_the_documented_fields() {
        let json = serde_json::to_value(ExecResult::default()).unwrap_or_default();
        for key in [
            "sandbox_id",
            "isolation",
            "exit_code",
            "signal",
            "stdout",
            "stderr",
            "stdout_truncated",
            "stderr_truncated",
            "timed_out",
            "oom_killed",
            "limit",
            "duration_ms",
            "phases",
            "usage",
            "error",
        ] {
            assert!(json.get(key).is_some(), "missing {key}");
        }
    }
}
