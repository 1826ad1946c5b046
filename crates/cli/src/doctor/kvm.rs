//! The KVM checks: `/dev/kvm` is there and opens read-write, and how fast KVM runs a guest beside software emulation:
//! the runtime's speed probe (the same tiny guest under `-accel kvm` and TCG, compared; cached per host boot, kernel
//! and QEMU), whose verdict is what `[microvm] accel = "auto"` starts guests with.

use std::fs::OpenOptions;
use std::path::Path;

use sandkasten_runtime::AccelVerdict;
use sandkasten_types::MicrovmAccel;

use super::report::{Check, CheckId};

/// The device.
const KVM_DEVICE: &str = "/dev/kvm";

/// The fix when KVM is not faster than emulation.
const SLOW_FIX: &str = "microVMs run under software emulation (isolation as strong, guests much slower); for \
                        KVM use a host with hardware virtualisation (bare metal, or a VM with nested VT-x/AMD-V)";

/// `/dev/kvm` exists and opens read-write.
pub fn device() -> Check {
    match OpenOptions::new().read(true).write(true).open(KVM_DEVICE) {
        Ok(_) => Check::ok(CheckId::KvmDevice, format!("{KVM_DEVICE} opens read-write")),
        Err(e) if !Path::new(KVM_DEVICE).exists() => Check::fail(
            CheckId::KvmDevice,
            format!("{KVM_DEVICE} does not exist"),
            format!(
                "enable virtualisation in the firmware and load kvm_intel or kvm_amd \
                 (in a VM: enable nested virtualisation) ({e})"
            ),
        ),
        Err(e) => Check::fail(
            CheckId::KvmDevice,
            format!("opening {KVM_DEVICE} read-write: {e}"),
            "run as root or add the user to the kvm group",
        ),
    }
}

/// The speed probe's verdict (`None`: QEMU is not installed, nothing was measured).
pub fn speed(verdict: Option<&AccelVerdict>) -> Check {
    match verdict {
        None => Check::fail(CheckId::KvmSpeed, "not measured: QEMU is not installed", SLOW_FIX),
        Some(verdict) if verdict.accel == MicrovmAccel::Kvm => Check::ok(CheckId::KvmSpeed, verdict.reason.clone()),
        Some(verdict) => Check::warn(CheckId::KvmSpeed, verdict.reason.clone(), SLOW_FIX),
    }
}

#[cfg(test)]
mod tests {
    use sandkasten_runtime::ProbeRun;

    use super::*;
    use crate::doctor::report::Status;

    fn verdict(accel: MicrovmAccel, reason: &str) -> AccelVerdict {
        let run = ProbeRun::Measured { iterations_per_s: 1e6, at_most: false };
        AccelVerdict { accel, reason: reason.to_owned(), kvm: run.clone(), tcg: run }
    }

    #[test]
    fn kvm_measured_slower_than_tcg_warns_with_the_measurement() {
        let check = speed(Some(&verdict(MicrovmAccel::Tcg, "KVM measured 428× slower than TCG")));
        assert_eq!(check.status, Status::Warn);
        assert_eq!(check.detail, "KVM measured 428× slower than TCG");
        assert!(check.fix.is_some_and(|fix| fix.contains("software emulation")));
        assert_eq!(speed(Some(&verdict(MicrovmAccel::Kvm, "KVM measured 9× faster"))).status, Status::Ok);
        assert_eq!(speed(None).status, Status::Fail);
    }
}
