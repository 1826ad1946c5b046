//! Hard limits of one sandbox, each with its unit and a safe default.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::units::{format_bytes, format_duration_ms};

/// The hard limits a sandbox runs under. Every field has a safe default (see `Limits::default`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Wall-clock time for one execution, in milliseconds; the whole process tree is killed when it runs out.
    /// Default 10 000 (10 s).
    pub timeout_ms: u64,
    /// Memory (RSS + page cache + tmpfs files) in bytes, swap 0; the kernel OOM-kills inside the sandbox beyond it.
    /// Default 256 MiB.
    pub memory_bytes: u64,
    /// Processes and threads alive at once. Default 128.
    pub pids: u64,
    /// CPU bandwidth in CPUs (1.0 = one core's worth of time per period). Default 1.0.
    pub cpus: f64,
    /// Size of each writable filesystem (`/workspace`, `/tmp`) and the largest file a process may write, in bytes.
    /// Default 128 MiB.
    pub disk_bytes: u64,
    /// Bytes kept per output stream (stdout, stderr); the sandbox is stopped when a stream goes past it.
    /// Default 1 MiB.
    pub output_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout_ms: 10_000,
            memory_bytes: 256 << 20,
            pids: 128,
            cpus: 1.0,
            disk_bytes: 128 << 20,
            output_bytes: 1 << 20,
        }
    }
}

/// A limit value outside what sandkasten can enforce.
#[derive(Debug, Error, PartialEq)]
pub enum LimitsError {
    /// A limit is below its minimum or above its maximum.
    #[error("{name} must be between {min} and {max}, got {got}")]
    OutOfRange {
        /// Which limit.
        name: &'static str,
        /// Smallest accepted value, formatted with its unit.
        min: String,
        /// Largest accepted value, formatted with its unit.
        max: String,
        /// The value given, formatted with its unit.
        got: String,
    },
}

impl Limits {
    /// Checks every limit against the range sandkasten can enforce on one host.
    pub fn validate(&self) -> Result<(), LimitsError> {
        let bytes = |name, got: u64, min: u64, max: u64| {
            if (min..=max).contains(&got) {
                Ok(())
            } else {
                Err(LimitsError::OutOfRange {
                    name,
                    min: format_bytes(min),
                    max: format_bytes(max),
                    got: format_bytes(got),
                })
            }
        };
        if !(1..=24 * 3_600_000).contains(&self.timeout_ms) {
            return Err(LimitsError::OutOfRange {
                name: "timeout",
                min: format_duration_ms(1),
                max: "24h".into(),
                got: format_duration_ms(self.timeout_ms),
            });
        }
        bytes("memory", self.memory_bytes, 8 << 20, 1 << 40)?;
        bytes("disk", self.disk_bytes, 1 << 20, 1 << 40)?;
        bytes("output limit", self.output_bytes, 1 << 10, 1 << 30)?;
        if !(1..=MAX_PIDS).contains(&self.pids) {
            return Err(LimitsError::OutOfRange {
                name: "pids",
                min: "1".into(),
                max: MAX_PIDS.to_string(),
                got: self.pids.to_string(),
            });
        }
        if !(self.cpus.is_finite() && (0.01..=1024.0).contains(&self.cpus)) {
            return Err(LimitsError::OutOfRange {
                name: "cpus",
                min: "0.01".into(),
                max: "1024".into(),
                got: self.cpus.to_string(),
            });
        }
        Ok(())
    }
}

/// The most processes a spec may ask for (a host may allow fewer: the runtime caps `pids` at a quarter of its
/// `kernel.pid_max`).
pub const MAX_PIDS: u64 = 65_536;

/// Which hard limit ended or constrained an execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// The wall-clock timeout fired; the whole tree was killed.
    Time,
    /// The memory limit was reached and the kernel OOM-killed a process.
    Memory,
    /// A stream went past the output limit; the sandbox was stopped.
    Output,
    /// A fork or clone was refused because the pids limit was reached.
    Pids,
    /// A writable filesystem filled up, or a file reached the largest allowed size.
    Disk,
}

impl LimitKind {
    /// The wire name (`time`, `memory`, `output`, `pids`, `disk`), also the metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::Time => "time",
            LimitKind::Memory => "memory",
            LimitKind::Output => "output",
            LimitKind::Pids => "pids",
            LimitKind::Disk => "disk",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(Limits::default().validate(), Ok(()));
    }

    #[test]
    fn out_of_range_names_the_limit() {
        let limits = Limits { memory_bytes: 1024, ..Limits::default() };
        let message = limits.validate().map_err(|e| e.to_string()).err().unwrap_or_default();
        assert_eq!(message, "memory must be between 8MiB and 1TiB, got 1KiB");
        assert!(Limits { cpus: f64::NAN, ..Limits::default() }.validate().is_err());
        assert!(Limits { pids: 0, ..Limits::default() }.validate().is_err());
        assert!(Limits { timeout_ms: 0, ..Limits::default() }.validate().is_err());
    }
}
