//! Which checks each isolation tier needs, and the per-tier verdict derived from the checks' outcomes.

use serde::Serialize;

use super::report::{Check, CheckId, Status, Tiers};

/// An isolation tier, in the order they are reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// Namespaces, seccomp, landlock, cgroups (the default).
    Process,
    /// gVisor's `runsc`.
    Gvisor,
    /// A guest kernel in QEMU (KVM where it runs at hardware speed, else software emulation).
    Microvm,
}

impl Tier {
    /// Every tier, in report order.
    pub const ALL: [Tier; 3] = [Tier::Process, Tier::Gvisor, Tier::Microvm];

    /// The tier's name as used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Process => "process",
            Tier::Gvisor => "gvisor",
            Tier::Microvm => "microvm",
        }
    }

    /// The checks this tier needs; a failed one makes the tier unusable, a warning does not. (Landlock is
    /// optional for the process tier: its check only ever warns.)
    pub fn requirements(self) -> &'static [CheckId] {
        match self {
            Tier::Process => &[
                CheckId::Root,
                CheckId::UserNamespaces,
                CheckId::Cgroups,
                CheckId::Seccomp,
                CheckId::Landlock,
                CheckId::Filesystems,
            ],
            Tier::Gvisor => &[CheckId::Runsc, CheckId::RunscStart],
            // KVM is not required: without it at hardware speed guests run under software emulation (TCG).
            Tier::Microvm => &[CheckId::Qemu, CheckId::MicrovmBoot],
        }
    }
}

/// One tier's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TierSummary {
    /// Whether sandboxes of this tier can run on this host.
    pub usable: bool,
    /// Why (the failed requirements), or which warnings apply, in one line.
    pub reason: String,
}

/// The verdict for every tier from the checks run.
pub fn summarize(checks: &[Check]) -> Tiers {
    Tiers {
        process: summarize_tier(Tier::Process, checks),
        gvisor: summarize_tier(Tier::Gvisor, checks),
        microvm: summarize_tier(Tier::Microvm, checks),
    }
}

/// A tier is usable when every requirement was checked and none failed. The reason names the failed requirements
/// (or, when usable, the ones with warnings); their details are in the checks.
fn summarize_tier(tier: Tier, checks: &[Check]) -> TierSummary {
    let mut failed = Vec::new();
    let mut warned = Vec::new();
    for id in tier.requirements() {
        match checks.iter().find(|c| c.id == *id) {
            None => failed.push(format!("{} (not checked)", id.name())),
            Some(check) => match check.status {
                Status::Ok => {}
                Status::Warn => warned.push(check.name.to_owned()),
                Status::Fail => failed.push(check.name.to_owned()),
            },
        }
    }
    if !failed.is_empty() {
        TierSummary { usable: false, reason: format!("failed: {}", failed.join(", ")) }
    } else if tier == Tier::Microvm {
        let kvm_at_speed = [CheckId::KvmDevice, CheckId::KvmSpeed]
            .iter()
            .all(|id| checks.iter().any(|check| check.id == *id && check.status == Status::Ok));
        let accel = if kvm_at_speed {
            "KVM at hardware speed: set [microvm] accel = \"kvm\""
        } else {
            "software emulation: isolation as strong, guests much slower; KVM is not usable at hardware speed here"
        };
        let warnings =
            if warned.is_empty() { String::new() } else { format!("; with warnings: {}", warned.join(", ")) };
        TierSummary { usable: true, reason: format!("{accel}{warnings}") }
    } else if !warned.is_empty() {
        TierSummary { usable: true, reason: format!("with warnings: {}", warned.join(", ")) }
    } else {
        TierSummary { usable: true, reason: "all requirements met".to_owned() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_ok() -> Vec<Check> {
        [
            CheckId::Root,
            CheckId::UserNamespaces,
            CheckId::Cgroups,
            CheckId::Seccomp,
            CheckId::Landlock,
            CheckId::Filesystems,
            CheckId::Runsc,
            CheckId::RunscStart,
            CheckId::Qemu,
            CheckId::MicrovmBoot,
            CheckId::KvmDevice,
            CheckId::KvmSpeed,
        ]
        .into_iter()
        .map(|id| Check::ok(id, "fine"))
        .collect()
    }

    fn replace(checks: &mut [Check], check: Check) {
        for slot in checks.iter_mut() {
            if slot.id == check.id {
                *slot = check.clone();
            }
        }
    }

    #[test]
    fn every_tier_is_usable_when_every_check_passes() {
        let tiers = summarize(&all_ok());
        for tier in [Tier::Process, Tier::Gvisor] {
            assert!(tiers.get(tier).usable, "{}", tier.name());
            assert_eq!(tiers.get(tier).reason, "all requirements met");
        }
        assert!(tiers.microvm.usable);
        assert!(tiers.microvm.reason.starts_with("KVM at hardware speed"), "{}", tiers.microvm.reason);
    }

    #[test]
    fn the_microvm_tier_runs_under_emulation_without_fast_kvm_and_not_at_all_without_qemu() {
        let mut checks = all_ok();
        replace(&mut checks, Check::fail(CheckId::KvmSpeed, "3 ms per exit", "use bare metal"));
        let tiers = summarize(&checks);
        assert!(tiers.microvm.usable);
        assert!(tiers.microvm.reason.starts_with("software emulation"), "{}", tiers.microvm.reason);
        replace(&mut checks, Check::fail(CheckId::Qemu, "not found", "install it"));
        let tiers = summarize(&checks);
        assert!(!tiers.microvm.usable);
        assert_eq!(tiers.microvm.reason, "failed: qemu (microvm)");
    }

    #[test]
    fn missing_landlock_only_warns_for_the_process_tier() {
        let mut checks = all_ok();
        replace(&mut checks, Check::warn(CheckId::Landlock, "abi 0", "enable it"));
        let tiers = summarize(&checks);
        assert!(tiers.process.usable);
        assert_eq!(tiers.process.reason, "with warnings: landlock");
    }

    #[test]
    fn a_failed_requirement_makes_only_its_tier_unusable() {
        let mut checks = all_ok();
        replace(&mut checks, Check::fail(CheckId::Root, "uid 1000", "run as root"));
        replace(&mut checks, Check::fail(CheckId::Cgroups, "read-only", "run as root"));
        replace(&mut checks, Check::fail(CheckId::MicrovmBoot, "no rootfs.ext4", "run setup"));
        let tiers = summarize(&checks);
        assert!(!tiers.process.usable);
        assert_eq!(tiers.process.reason, "failed: root, cgroups");
        assert!(tiers.gvisor.usable);
        assert!(!tiers.microvm.usable);
        assert_eq!(tiers.microvm.reason, "failed: microvm images");
    }

    #[test]
    fn gvisor_needs_runsc_to_start_a_sandbox_not_only_to_be_installed() {
        let mut checks = all_ok();
        replace(&mut checks, Check::fail(CheckId::RunscStart, "exited with 128: no platform", "fix it"));
        let tiers = summarize(&checks);
        assert!(!tiers.gvisor.usable);
        assert_eq!(tiers.gvisor.reason, "failed: runsc start");
        assert!(tiers.process.usable);
    }

    #[test]
    fn an_unchecked_requirement_counts_as_failed() {
        let checks: Vec<Check> = all_ok().into_iter().filter(|c| c.id != CheckId::Runsc).collect();
        let tiers = summarize(&checks);
        assert!(!tiers.gvisor.usable);
        assert_eq!(tiers.gvisor.reason, "failed: runsc (gvisor) (not checked)");
    }
}
