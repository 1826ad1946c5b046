//! What `isolation: "auto"` decides from (`Workload`: what the code needs, its I/O profile, whether it needs its own
//! kernel) and what every answer says about the tier a sandbox got (`Isolation`: the tier, why, and for a microVM how
//! its guest runs). The rules that decide are the server's (`[isolation.auto]`); this crate only names the facts.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::tier::{MicrovmAccel, Tier};

/// The tier a sandbox runs on and why: in every create answer, sandbox info and result.
///
/// JSON: `{"tier": "microvm", "reason": "auto: needs its own kernel", "accel": "tcg"}`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Isolation {
    /// The tier it runs on (never `auto`: the server resolves that before the sandbox exists).
    pub tier: Tier,
    /// Why: `requested` (the request named the tier), `server default` (`[defaults] isolation`), or `auto: …` (the
    /// `[isolation.auto]` rule that chose it, in words, and which tiers it skipped because they are not usable here).
    pub reason: String,
    /// How a microVM's guest runs, as the runtime started it: `kvm` or `tcg` (software emulation). Absent on the
    /// other tiers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accel: Option<MicrovmAccel>,
}

impl Isolation {
    /// The reason of a tier the request named.
    pub const REQUESTED: &'static str = "requested";
    /// The reason of a tier the server's `[defaults] isolation` gave.
    pub const SERVER_DEFAULT: &'static str = "server default";

    /// `tier`, for `reason`, without an acceleration (the runtime adds it for a microVM).
    pub fn new(tier: Tier, reason: impl Into<String>) -> Isolation {
        Isolation { tier, reason: reason.into(), accel: None }
    }
}

impl std::fmt::Display for Isolation {
    /// The tier, and a microVM's acceleration: `gvisor`, `microvm (tcg)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.accel {
            Some(accel) => write!(f, "{} ({})", self.tier, accel.name()),
            None => write!(f, "{}", self.tier),
        }
    }
}

/// What a sandbox's code needs, as its request says: the facts `isolation: "auto"` decides from. Every field is
/// optional; unset means "not said" (rules that ask about it do not match).
///
/// JSON: `{"needs": "linux", "io_profile": "syscall_heavy", "needs_kernel": true}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct Workload {
    /// `language`: pure computation in one language; `linux`: a full Linux (processes, compilers, packages).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub needs: Option<CodeNeeds>,
    /// `compute` or `syscall_heavy` (builds, tests, many small processes and files).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io_profile: Option<IoProfile>,
    /// True when the code needs a kernel of its own (kernel modules, a specialised Linux): only a microVM has one.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub needs_kernel: bool,
}

impl Workload {
    /// True when the request said nothing about its workload.
    pub fn is_unset(&self) -> bool {
        *self == Workload::default()
    }
}

/// What the code needs of its system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum CodeNeeds {
    /// Pure computation in one language (an interpreter and its standard library).
    Language,
    /// A full Linux: processes, compilers, package managers.
    Linux,
}

/// How the code uses the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum IoProfile {
    /// Mostly computation: few system calls.
    Compute,
    /// Builds and tests: many system calls, files and short processes (slow under gVisor's user-space kernel).
    SyscallHeavy,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isolation_json_has_accel_only_when_set() -> Result<(), serde_json::Error> {
        let plain = serde_json::to_value(Isolation::new(Tier::Gvisor, Isolation::REQUESTED))?;
        assert_eq!(plain, serde_json::json!({"tier": "gvisor", "reason": "requested"}));
        let vm = Isolation { accel: Some(MicrovmAccel::Tcg), ..Isolation::new(Tier::Microvm, "auto: x") };
        assert_eq!(serde_json::to_value(vm)?["accel"], "tcg");
        Ok(())
    }

    #[test]
    fn workloads_parse_and_refuse_unknown_fields() -> Result<(), serde_json::Error> {
        let workload: Workload =
            serde_json::from_str(r#"{"needs": "linux", "io_profile": "syscall_heavy", "needs_kernel": true}"#)?;
        assert_eq!(workload.needs, Some(CodeNeeds::Linux));
        assert_eq!(workload.io_profile, Some(IoProfile::SyscallHeavy));
        assert!(workload.needs_kernel && !workload.is_unset());
        assert!(serde_json::from_str::<Workload>(r#"{"kernel": true}"#).is_err());
        assert_eq!(serde_json::to_value(Workload::default())?, serde_json::json!({}));
        Ok(())
    }
}
