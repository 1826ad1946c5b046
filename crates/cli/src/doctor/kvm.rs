//! The microvm tier's checks: `/dev/kvm` is there and opens read-write, and guest code runs at hardware speed
//! (timed with `kvm_probe`, under a hard deadline so that doctor never hangs on a wedged KVM).
//!
//! Two numbers decide: the cost of a VM exit round trip (hardware ~1–5 µs) and the guest's own instruction speed
//! (a `dec`/`jnz` loop: hardware well under 1 ns per iteration). Emulated nested virtualisation can have cheap
//! exits yet run guest code ~1000× slower, so both are measured.

use std::sync::mpsc;
use std::time::Duration;

use super::kvm_probe::{self, KVM_DEVICE, ProbePlan, SPIN_ITERATIONS, Timings};
use super::report::{Check, CheckId};

/// What the probe measures: 1000 bare exits, 100 runs of guest compute, each phase cut at 300 ms.
const PLAN: ProbePlan = ProbePlan { exits: 1000, spins: 100, phase_budget: Duration::from_millis(300) };
/// Give up on a probe that has not finished after this long (a single KVM_RUN can block).
const PROBE_DEADLINE: Duration = Duration::from_millis(1000);
/// Hardware speed: exit round trip at most this (µs) ...
const HARDWARE_EXIT_US: f64 = 20.0;
/// ... and a guest loop iteration at most this (ns).
const HARDWARE_ITERATION_NS: f64 = 3.0;
/// Slower than hardware but practical (hardware-assisted nesting): exit at most this (µs) ...
const NESTED_EXIT_US: f64 = 200.0;
/// ... and a loop iteration at most this (ns).
const NESTED_ITERATION_NS: f64 = 30.0;
/// The fix when KVM is too slow.
const SLOW_FIX: &str = "use a host with hardware virtualisation (bare metal, or a VM with nested VT-x/AMD-V) \
                        for the microvm tier";

/// `/dev/kvm` exists and opens read-write.
pub fn device() -> Check {
    match kvm_probe::open_device() {
        Ok(_) => Check::ok(CheckId::KvmDevice, format!("{KVM_DEVICE} opens read-write")),
        Err(e) if !std::path::Path::new(KVM_DEVICE).exists() => Check::fail(
            CheckId::KvmDevice,
            format!("{KVM_DEVICE} does not exist"),
            format!(
                "enable virtualisation in the firmware and load kvm_intel or kvm_amd \
                 (in a VM: enable nested virtualisation) ({e})"
            ),
        ),
        Err(e) => Check::fail(CheckId::KvmDevice, e.to_string(), "run as root or add the user to the kvm group"),
    }
}

/// Times the probe on its own thread; past the deadline the thread is abandoned (it dies with the process).
pub fn speed() -> Check {
    if kvm_probe::open_device().is_err() {
        return Check::fail(CheckId::KvmSpeed, "not measured: no usable /dev/kvm", SLOW_FIX);
    }
    let (sender, receiver) = mpsc::channel();
    let spawned = std::thread::Builder::new().name("kvm-probe".to_owned()).spawn(move || {
        let _ = sender.send(kvm_probe::probe(PLAN).map_err(|e| e.to_string()));
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
            format!(
                "not usable at hardware speed: the probe VM did not finish within {} ms",
                PROBE_DEADLINE.as_millis()
            ),
            SLOW_FIX,
        ),
    }
}

/// Per-unit costs derived from the probe's timings.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Speed {
    /// Mean exit round trip, µs.
    exit_us: f64,
    /// Mean guest loop iteration, ns (the spin runs' time minus their exits).
    iteration_ns: f64,
}

fn speed_of(timings: &Timings) -> Speed {
    let exit_us = timings.exits_time.as_secs_f64() * 1e6 / f64::from(timings.exits.max(1));
    let spin_us = timings.spins_time.as_secs_f64() * 1e6 - exit_us * f64::from(timings.spins);
    let iterations = f64::from(timings.spins.max(1)) * f64::from(SPIN_ITERATIONS);
    Speed { exit_us, iteration_ns: (spin_us * 1e3 / iterations).max(0.0) }
}

/// The verdict from the probe's timings against the hardware and nested thresholds.
pub fn speed_verdict(timings: &Timings) -> Check {
    let speed = speed_of(timings);
    let measured = format!(
        "guest loop {:.1} ns/iteration (hardware <1), VM exit {:.1} µs (hardware 1-5)",
        speed.iteration_ns, speed.exit_us
    );
    if speed.exit_us <= HARDWARE_EXIT_US && speed.iteration_ns <= HARDWARE_ITERATION_NS {
        Check::ok(CheckId::KvmSpeed, format!("hardware speed: {measured}"))
    } else if speed.exit_us <= NESTED_EXIT_US && speed.iteration_ns <= NESTED_ITERATION_NS {
        Check::warn(
            CheckId::KvmSpeed,
            format!("slower than hardware (nested?): {measured}"),
            "expect slower microVM starts than on bare metal",
        )
    } else {
        Check::fail(CheckId::KvmSpeed, format!("not usable at hardware speed: {measured}"), SLOW_FIX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::report::Status;

    /// Timings with the given per-exit µs and per-iteration ns.
    fn timings(exit_us: u64, iteration_ns: f64) -> Timings {
        let exits = 1000;
        let spins = 10;
        let spin_ns = iteration_ns * f64::from(SPIN_ITERATIONS) * f64::from(spins);
        Timings {
            setup: Duration::from_millis(2),
            first_run: Duration::from_micros(50),
            exits,
            exits_time: Duration::from_micros(exit_us * u64::from(exits)),
            spins,
            spins_time: Duration::from_micros(exit_us * u64::from(spins)) + Duration::from_nanos(spin_ns as u64),
        }
    }

    #[test]
    fn hardware_kvm_passes() {
        let check = speed_verdict(&timings(3, 0.4));
        assert_eq!(check.status, Status::Ok, "{}", check.detail);
        assert!(check.detail.contains("exit 3.0 µs"), "{}", check.detail);
        assert!(check.detail.contains("loop 0.4 ns/iteration"), "{}", check.detail);
    }

    #[test]
    fn nested_hardware_kvm_warns() {
        assert_eq!(speed_verdict(&timings(80, 0.5)).status, Status::Warn);
        assert_eq!(speed_verdict(&timings(5, 10.0)).status, Status::Warn);
    }

    #[test]
    fn slow_exits_are_not_hardware_speed() {
        let check = speed_verdict(&timings(2_500, 0.5));
        assert_eq!(check.status, Status::Fail);
        assert!(check.detail.starts_with("not usable at hardware speed"), "{}", check.detail);
        assert!(check.fix.is_some());
    }

    #[test]
    fn emulated_guest_code_is_not_hardware_speed_even_with_fast_exits() {
        assert_eq!(speed_verdict(&timings(8, 400.0)).status, Status::Fail);
    }
}
