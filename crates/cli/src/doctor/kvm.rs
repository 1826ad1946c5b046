//! The microvm tier's checks: `/dev/kvm` is there and opens read-write, and guest code runs at hardware speed
//! (timed with `kvm_probe`, under a hard deadline so that doctor never hangs on a wedged KVM).

use std::sync::mpsc;
use std::time::Duration;

use super::kvm_probe::{self, KVM_DEVICE, Timings};
use super::report::{Check, CheckId};

/// Exits to time after the first one.
const PROBE_EXITS: u32 = 1000;
/// Stop timing exits after this long (emulated KVM manages a few hundred).
const PROBE_BUDGET: Duration = Duration::from_millis(500);
/// Give up on a probe that has not finished after this long (a single KVM_RUN can block).
const PROBE_DEADLINE: Duration = Duration::from_millis(1500);
/// At or below this per-exit time, KVM runs at hardware speed (hardware: ~1–5 µs).
const HARDWARE_EXIT_US: f64 = 20.0;
/// At or below this, KVM is slowed (hardware-assisted nesting) but microVMs are practical.
const NESTED_EXIT_US: f64 = 200.0;

/// `/dev/kvm` exists and opens read-write.
pub fn device() -> Check {
    match kvm_probe::open_device() {
        Ok(_) => Check::ok(CheckId::KvmDevice, format!("{KVM_DEVICE} opens read-write")),
        Err(e) if !std::path::Path::new(KVM_DEVICE).exists() => Check::fail(
            CheckId::KvmDevice,
            format!("{KVM_DEVICE} does not exist ({e})"),
            "enable virtualisation in the firmware and load kvm_intel or kvm_amd (on a VM: enable nested virtualisation)",
        ),
        Err(e) => Check::fail(
            CheckId::KvmDevice,
            e.to_string(),
            "run as root or add the user to the kvm group",
        ),
    }
}

/// Times the probe on its own thread; the thread is abandoned (and dies with the process) past the deadline.
pub fn speed() -> Check {
    let (sender, receiver) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("kvm-probe".to_owned())
        .spawn(move || {
            let _ = sender.send(kvm_probe::probe(PROBE_EXITS, PROBE_BUDGET).map_err(|e| e.to_string()));
        });
    if let Err(e) = spawned {
        return Check::fail(CheckId::KvmSpeed, format!("cannot start the probe thread: {e}"), "retry");
    }
    match receiver.recv_timeout(PROBE_DEADLINE) {
        Ok(Ok(timings)) => speed_verdict(&timings),
        Ok(Err(e)) => Check::fail(
            CheckId::KvmSpeed,
            format!("probe VM failed: {e}"),
            "check dmesg for KVM errors; the microvm tier needs a working /dev/kvm",
        ),
        Err(_) => Check::fail(
            CheckId::KvmSpeed,
            format!("probe VM did not finish within {} ms", PROBE_DEADLINE.as_millis()),
            "use a host with hardware virtualisation (bare metal, or a VM with nested VT-x/AMD-V)",
        ),
    }
}

/// The verdict from the probe's timings: mean time per exit against the hardware and nested thresholds.
pub fn speed_verdict(timings: &Timings) -> Check {
    let Some(per_exit_us) = per_exit_micros(timings) else {
        return Check::fail(
            CheckId::KvmSpeed,
            format!(
                "not usable at hardware speed: the first guest exit alone took {:.1} ms",
                millis(timings.first_run)
            ),
            "use a host with hardware virtualisation (bare metal, or a VM with nested VT-x/AMD-V)",
        );
    };
    let measured = format!(
        "{} exits in {:.1} ms = {per_exit_us:.1} µs/exit (hardware: ~1-5 µs); VM setup {:.1} ms",
        timings.exits,
        millis(timings.exits_time),
        millis(timings.setup)
    );
    if per_exit_us <= HARDWARE_EXIT_US {
        Check::ok(CheckId::KvmSpeed, format!("hardware speed: {measured}"))
    } else if per_exit_us <= NESTED_EXIT_US {
        Check::warn(
            CheckId::KvmSpeed,
            format!("slower than hardware (nested?): {measured}"),
            "expect slower microVM starts; bare metal is ~10x faster",
        )
    } else {
        Check::fail(
            CheckId::KvmSpeed,
            format!("not usable at hardware speed: {measured}"),
            "use a host with hardware virtualisation (bare metal, or a VM with nested VT-x/AMD-V); \
             here KVM is emulated",
        )
    }
}

/// Mean microseconds per timed exit; `None` when no exit was timed.
fn per_exit_micros(timings: &Timings) -> Option<f64> {
    (timings.exits > 0).then(|| timings.exits_time.as_secs_f64() * 1e6 / f64::from(timings.exits))
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::report::Status;

    fn timings(exits: u32, total: Duration) -> Timings {
        Timings {
            setup: Duration::from_millis(2),
            first_run: Duration::from_micros(50),
            exits,
            exits_time: total,
        }
    }

    #[test]
    fn hardware_kvm_passes() {
        let check = speed_verdict(&timings(1000, Duration::from_millis(3)));
        assert_eq!(check.status, Status::Ok);
        assert!(check.detail.contains("3.0 µs/exit"), "{}", check.detail);
    }

    #[test]
    fn nested_hardware_kvm_warns() {
        assert_eq!(speed_verdict(&timings(1000, Duration::from_millis(80))).status, Status::Warn);
    }

    #[test]
    fn emulated_kvm_is_not_usable_at_hardware_speed() {
        let check = speed_verdict(&timings(200, Duration::from_millis(500)));
        assert_eq!(check.status, Status::Fail);
        assert!(check.detail.starts_with("not usable at hardware speed"), "{}", check.detail);
        assert!(check.fix.is_some());
    }

    #[test]
    fn no_timed_exit_fails() {
        assert_eq!(speed_verdict(&timings(0, Duration::ZERO)).status, Status::Fail);
    }
}
