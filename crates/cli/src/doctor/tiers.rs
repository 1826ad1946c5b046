//! Which checks each isolation tier needs, and the per-tier verdict derived from the checks' outcomes.

use serde::Serialize;

use sandkasten_types::{MicrovmAccel, Tier};

use super::microvm::MicrovmChoice;
use super::report::{Check, CheckId, Status, Tiers};

/// The tiers reported, in order: every tier a sandbox runs on (`auto` resolves to one of them).
pub const REPORTED: [Tier; 3] = Tier::CREATABLE;

/// The checks `tier` needs; a failed one makes the tier unusable, a warning does not. (Landlock is optional for the
/// process tier: its check only ever warns.) `auto` needs nothing of its own.
pub fn requirements(tier: Tier) -> &'static [CheckId] {
    match tier {
        Tier::Process => &[
            CheckId::Root,
            CheckId::UserNamespaces,
            CheckId::Cgroups,
            CheckId::Seccomp,
            CheckId::Landlock,
            CheckId::Filesystems,
        ],
        Tier::Gvisor => &[CheckId::Runsc, CheckId::RunscStart],
        // KVM is not required: without it at hardware speed guests run under software emulation (TCG), where
        // `[microvm] allow_emulation` allows it (the acceleration check).
        Tier::Microvm => &[CheckId::Qemu, CheckId::MicrovmBoot, CheckId::MicrovmAccel],
        Tier::Auto => &[],
    }
}

/// One tier's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TierSummary {
    /// Whether sandboxes of this tier can run on this host.
    pub usable: bool,
    /// Why (the failed requirements), or which warnings apply, in one line.
    pub reason: String,
    /// How a usable microVM tier runs guests: `kvm` or `tcg` (absent for the other tiers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accel: Option<MicrovmAccel>,
}

impl TierSummary {
    /// `usable`, `usable (software emulation)`, `usable (kvm)` or `unusable`.
    pub fn verdict(&self) -> &'static str {
        match (self.usable, self.accel) {
            (false, _) => "unusable",
            (true, Some(MicrovmAccel::Kvm)) => "usable (kvm)",
            (true, Some(MicrovmAccel::Tcg | MicrovmAccel::Auto)) => "usable (software emulation)",
            (true, None) => "usable",
        }
    }
}

/// The verdict for every tier from the checks run and the acceleration microVMs get (`None`: not known).
pub fn summarize(checks: &[Check], microvm: Option<&MicrovmChoice>) -> Tiers {
    Tiers {
        process: summarize_tier(Tier::Process, checks, None),
        gvisor: summarize_tier(Tier::Gvisor, checks, None),
        microvm: summarize_tier(Tier::Microvm, checks, microvm),
    }
}

/// A tier is usable when every requirement was checked and none failed. The reason names the failed requirements
/// (or, when usable, the ones with warnings; a microVM's, how its guests run and why); their details are in the
/// checks.
fn summarize_tier(tier: Tier, checks: &[Check], microvm: Option<&MicrovmChoice>) -> TierSummary {
    let mut failed = Vec::new();
    let mut warned = Vec::new();
    for id in requirements(tier) {
        match checks.iter().find(|c| c.id == *id) {
            None => failed.push(format!("{} (not checked)", id.name())),
            Some(check) => match check.status {
                Status::Ok => {}
                Status::Warn => warned.push(check.name.to_owned()),
                Status::Fail => failed.push(check.name.to_owned()),
            },
        }
    }
    let warnings = if warned.is_empty() { None } else { Some(format!("with warnings: {}", warned.join(", "))) };
    if !failed.is_empty() {
        let mut reason = format!("failed: {}", failed.join(", "));
        if let Some(choice) = microvm.filter(|_| failed.contains(&CheckId::MicrovmAccel.name().to_owned())) {
            reason.push_str(&format!(
                " (software emulation, which [microvm] allow_emulation = false forbids: {})",
                choice.reason
            ));
        }
        return TierSummary { usable: false, reason, accel: None };
    }
    match microvm {
        Some(choice) if tier == Tier::Microvm => {
            let reason = match warnings {
                Some(warnings) => format!("{}; {warnings}", choice.reason),
                None => choice.reason.clone(),
            };
            TierSummary { usable: true, reason, accel: Some(choice.accel) }
        }
        _ => TierSummary {
            usable: true,
            reason: warnings.unwrap_or_else(|| "all requirements met".to_owned()),
            accel: None,
        },
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
            CheckId::MicrovmAccel,
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

    fn choice(accel: MicrovmAccel, reason: &str) -> MicrovmChoice {
        MicrovmChoice { accel, reason: reason.to_owned() }
    }

    fn summarize(checks: &[Check]) -> Tiers {
        super::summarize(checks, Some(&choice(MicrovmAccel::Kvm, "KVM measured 9× faster than TCG")))
    }

    #[test]
    fn every_tier_is_usable_when_every_check_passes() {
        let tiers = summarize(&all_ok());
        for tier in [Tier::Process, Tier::Gvisor] {
            let Some(summary) = tiers.get(tier) else { panic!("{tier} is reported") };
            assert!(summary.usable, "{}", tier.name());
            assert_eq!(summary.reason, "all requirements met");
            assert_eq!(summary.verdict(), "usable");
        }
        assert!(tiers.microvm.usable);
        assert_eq!(tiers.microvm.verdict(), "usable (kvm)");
        assert_eq!(tiers.microvm.reason, "KVM measured 9× faster than TCG");
    }

    #[test]
    fn the_microvm_tier_runs_under_emulation_without_fast_kvm_and_not_at_all_without_qemu() {
        let mut checks = all_ok();
        replace(&mut checks, Check::warn(CheckId::KvmSpeed, "KVM measured 428× slower than TCG", "use bare metal"));
        let emulated = choice(MicrovmAccel::Tcg, "KVM measured 428× slower than TCG");
        let tiers = super::summarize(&checks, Some(&emulated));
        assert!(tiers.microvm.usable);
        assert_eq!(tiers.microvm.accel, Some(MicrovmAccel::Tcg));
        assert_eq!(
            format!("microvm {}: {}", tiers.microvm.verdict(), tiers.microvm.reason),
            "microvm usable (software emulation): KVM measured 428× slower than TCG"
        );
        replace(&mut checks, Check::fail(CheckId::Qemu, "not found", "install it"));
        let tiers = super::summarize(&checks, Some(&emulated));
        assert!(!tiers.microvm.usable);
        assert_eq!(tiers.microvm.reason, "failed: qemu (microvm)");
    }

    #[test]
    fn forbidden_emulation_makes_the_microvm_tier_unusable_saying_why() {
        let mut checks = all_ok();
        replace(&mut checks, Check::fail(CheckId::MicrovmAccel, "software emulation, forbidden", "allow it"));
        let emulated = choice(MicrovmAccel::Tcg, "KVM measured 428× slower than TCG");
        let tiers = super::summarize(&checks, Some(&emulated));
        assert!(!tiers.microvm.usable);
        assert_eq!(tiers.microvm.verdict(), "unusable");
        assert_eq!(
            tiers.microvm.reason,
            "failed: microvm accel (software emulation, which [microvm] allow_emulation = false forbids: KVM \
             measured 428× slower than TCG)"
        );
        assert!(tiers.process.usable && tiers.gvisor.usable);
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
