//! Doctor's vocabulary (a check: what was looked at, how it went, what to do about it) and the two renderings of a
//! report: aligned text for people, one JSON object for programs.

use std::fmt::Write as _;

use serde::Serialize;

use sandkasten_types::Tier;

use super::tiers::{REPORTED, TierSummary};

/// How a check went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Works as needed.
    Ok,
    /// Works, but something is degraded or optional is missing.
    Warn,
    /// Does not work; the tiers that need it are unusable.
    Fail,
}

impl Status {
    /// The word printed in the first column.
    pub fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// What a check looks at; tiers name their requirements by these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckId {
    /// Effective uid 0 (cgroups and id maps need it).
    Root,
    /// User namespaces are enabled and one can be created.
    UserNamespaces,
    /// A cgroup with memory, pids and cpu limits can be created.
    Cgroups,
    /// The kernel has seccomp filters and the sandbox policy compiles.
    Seccomp,
    /// The kernel's landlock ABI.
    Landlock,
    /// tmpfs and overlay are available.
    Filesystems,
    /// gVisor's `runsc` is installed.
    Runsc,
    /// `runsc` starts a sandbox (`runsc do /bin/true`).
    RunscStart,
    /// QEMU (`qemu-system-x86_64`) is installed and answers `--version`.
    Qemu,
    /// The microvm tier's guest kernel, initramfs and root image are in `[microvm] dir`.
    MicrovmBoot,
    /// `/dev/kvm` exists and opens read-write.
    KvmDevice,
    /// How fast KVM runs a guest beside software emulation (the runtime's speed probe).
    KvmSpeed,
    /// The acceleration microVMs get (`[microvm] accel`, for `auto` the probe's verdict) is allowed here.
    MicrovmAccel,
}

impl CheckId {
    /// The name printed in the second column.
    pub fn name(self) -> &'static str {
        match self {
            CheckId::Root => "root",
            CheckId::UserNamespaces => "user namespaces",
            CheckId::Cgroups => "cgroups",
            CheckId::Seccomp => "seccomp",
            CheckId::Landlock => "landlock",
            CheckId::Filesystems => "tmpfs/overlay",
            CheckId::Runsc => "runsc (gvisor)",
            CheckId::RunscStart => "runsc start",
            CheckId::Qemu => "qemu (microvm)",
            CheckId::MicrovmBoot => "microvm images",
            CheckId::KvmDevice => "kvm device",
            CheckId::KvmSpeed => "kvm speed",
            CheckId::MicrovmAccel => "microvm accel",
        }
    }
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Stable identifier (`user_namespaces`, ...).
    pub id: CheckId,
    /// Human name (`user namespaces`, ...).
    pub name: &'static str,
    /// How it went.
    pub status: Status,
    /// What was found, in one line.
    pub detail: String,
    /// One sentence saying what to do; present whenever `status` is not ok.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    /// A passing check.
    pub fn ok(id: CheckId, detail: impl Into<String>) -> Check {
        Check::new(id, Status::Ok, detail.into(), None)
    }

    /// A degraded check with its fix.
    pub fn warn(id: CheckId, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check::new(id, Status::Warn, detail.into(), Some(fix.into()))
    }

    /// A failed check with its fix.
    pub fn fail(id: CheckId, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check::new(id, Status::Fail, detail.into(), Some(fix.into()))
    }

    fn new(id: CheckId, status: Status, detail: String, fix: Option<String>) -> Check {
        Check { id, name: id.name(), status, detail, fix }
    }
}

/// Every tier's verdict, in a fixed order (serialises as `{"process": .., "gvisor": .., "microvm": ..}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tiers {
    /// The default tier.
    pub process: TierSummary,
    /// runsc.
    pub gvisor: TierSummary,
    /// KVM microVMs.
    pub microvm: TierSummary,
}

impl Tiers {
    /// The verdict for one tier (`None` for `auto`, which is not a tier of its own).
    pub fn get(&self, tier: Tier) -> Option<&TierSummary> {
        match tier {
            Tier::Process => Some(&self.process),
            Tier::Gvisor => Some(&self.gvisor),
            Tier::Microvm => Some(&self.microvm),
            Tier::Auto => None,
        }
    }
}

/// The whole report, as printed with `--json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Every check, in the order run.
    pub checks: Vec<Check>,
    /// What that means per tier.
    pub tiers: Tiers,
}

/// Width of the status column (`fail` plus padding).
const STATUS_WIDTH: usize = 6;
/// Minimum width of the name column.
const NAME_WIDTH: usize = 21;

/// The report as aligned text: one line per check (`ok    user namespaces      created one`), an indented `fix:`
/// line under each check that is not ok, then one sentence per tier (`microvm usable (software emulation): …`).
pub fn render_text(report: &Report) -> String {
    let name_width = report.checks.iter().map(|c| c.name.len() + 2).max().unwrap_or(0).max(NAME_WIDTH);
    let mut out = String::new();
    for check in &report.checks {
        let _ = writeln!(out, "{:<STATUS_WIDTH$}{:<name_width$}{}", check.status.label(), check.name, check.detail);
        if let Some(fix) = &check.fix {
            let _ = writeln!(out, "{:<STATUS_WIDTH$}{:<name_width$}fix: {fix}", "", "");
        }
    }
    let _ = writeln!(out, "\ntiers:");
    for (tier, summary) in REPORTED.into_iter().filter_map(|tier| Some((tier, report.tiers.get(tier)?))) {
        let _ = writeln!(out, "{:<STATUS_WIDTH$}{} {}: {}", "", tier.name(), summary.verdict(), summary.reason);
    }
    out
}

/// The report as one JSON object (pretty-printed).
pub fn render_json(report: &Report) -> Result<String, serde_json::Error> {
    serde_json::to_string_pretty(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::tiers::summarize;

    fn sample() -> Report {
        let checks = vec![
            Check::ok(CheckId::UserNamespaces, "created one (max 15000)"),
            Check::fail(CheckId::Runsc, "not found in PATH", "install runsc"),
        ];
        let tiers = summarize(&checks, None);
        Report { checks, tiers }
    }

    #[test]
    fn text_columns_are_aligned_and_fix_follows_a_failed_check() {
        let text = render_text(&sample());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "ok    user namespaces      created one (max 15000)");
        assert_eq!(lines[1], "fail  runsc (gvisor)       not found in PATH");
        assert_eq!(lines[2], "                           fix: install runsc");
        assert!(
            text.contains("\n      gvisor unusable: failed: runsc (gvisor), runsc start (not checked)\n"),
            "{text}"
        );
    }

    #[test]
    fn json_has_checks_and_every_tier() {
        let json = render_json(&sample()).unwrap_or_default();
        let value: serde_json::Value = serde_json::from_str(&json).unwrap_or_default();
        assert_eq!(value["checks"][0]["id"], "user_namespaces");
        assert_eq!(value["checks"][0]["status"], "ok");
        assert!(value["checks"][0].get("fix").is_none());
        assert_eq!(value["checks"][1]["fix"], "install runsc");
        for tier in ["process", "gvisor", "microvm"] {
            assert!(value["tiers"][tier]["usable"].is_boolean(), "{tier}");
            assert!(value["tiers"][tier]["reason"].is_string(), "{tier}");
        }
    }
}
