//! The speed probe behind `[microvm] accel = "auto"`: the same tiny guest run under QEMU once with `-accel kvm` and
//! once with TCG, each for a short window, and the two guest speeds compared. The guest is a 64 KiB firmware image
//! (`-bios`) whose reset vector jumps to a real-mode loop: `PROBE_TICK_ITERATIONS` iterations of `dec ecx; jnz`, then
//! one byte to QEMU's debug console port (one VM exit under KVM), and again. The host counts those bytes per
//! second. Hardware KVM runs the loop at the CPU's speed (~10× TCG); KVM on emulated nested virtualisation (the
//! `kvm_pvm` module) runs it hundreds of times slower than TCG. No kernel, disk or device is involved, so a run
//! costs QEMU's start (~0.1 s) plus the window.

#![allow(unsafe_code)]

use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sandkasten_types::MicrovmAccel;
use serde::{Deserialize, Serialize};

use super::qemu;

/// Guest loop iterations between two ticks (one byte on the debug console).
pub const PROBE_TICK_ITERATIONS: u32 = 100_000;

/// How long QEMU may take to show the first tick (its start, the firmware's first instructions).
const FIRST_TICK_DEADLINE: Duration = Duration::from_secs(5);

/// How long ticks are counted after the first.
const WINDOW: Duration = Duration::from_millis(500);

/// The I/O port of QEMU's debug console (`-debugcon`), where the guest writes a tick.
const DEBUGCON_PORT: u16 = 0xe9;

/// How one acceleration ran the probe guest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum ProbeRun {
    /// The guest ran: this many loop iterations per second (`at_most`: no tick came after the first within the
    /// window, so the rate is an upper bound).
    Measured {
        /// Guest loop iterations per second.
        iterations_per_s: f64,
        /// True when the rate is only an upper bound.
        at_most: bool,
    },
    /// The guest did not run; why, in QEMU's words when it said any.
    Failed {
        /// What went wrong.
        why: String,
    },
}

/// The guest's firmware image: 64 KiB (QEMU wants a multiple of it), `hlt` everywhere but the loop at `0xff00`
/// and the jump to it at the reset vector (`0xfff0`, run in real mode with CS base `0xffff0000`).
pub(crate) fn firmware() -> Vec<u8> {
    let [iter0, iter1, iter2, iter3] = PROBE_TICK_ITERATIONS.to_le_bytes();
    let [port0, port1] = DEBUGCON_PORT.to_le_bytes();
    let code = [
        0xBA, port0, port1, // mov dx, DEBUGCON_PORT
        0x66, 0xB9, iter0, iter1, iter2, iter3, // top: mov ecx, PROBE_TICK_ITERATIONS
        0x66, 0x49, // l: dec ecx
        0x75, 0xFC, // jnz l
        0xB0, b'.', // mov al, '.'
        0xEE, // out dx, al
        0xEB, 0xF1, // jmp top
    ];
    let mut image = vec![0xF4; 64 << 10];
    image[0xFF00..0xFF00 + code.len()].copy_from_slice(&code);
    // jmp near 0xff00 (relative to the next instruction at 0xfff3).
    let [rel0, rel1] = (0xFF00u16.wrapping_sub(0xFFF3)).to_le_bytes();
    image[0xFFF0..0xFFF3].copy_from_slice(&[0xE9, rel0, rel1]);
    image
}

/// Runs the probe guest under `accel` (`kvm` or `tcg`) with the QEMU at `qemu_path` and the firmware at `firmware`.
pub(crate) fn run(qemu_path: &Path, firmware: &Path, accel: MicrovmAccel) -> ProbeRun {
    let mut command = Command::new(qemu_path);
    command
        .args(["-M", "microvm,x-option-roms=off,rtc=off,isa-serial=off,pit=off,pic=off"])
        .args(qemu::accel_args(accel))
        .args(["-m", "16M", "-nodefaults", "-no-user-config", "-display", "none", "-debugcon", "stdio"])
        .args(["-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"])
        .arg("-bios")
        .arg(firmware)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // The probe's guest loops for ever: a QEMU whose caller is killed mid-probe must not outlive it.
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before execve and only calls prctl and getppid.
    unsafe {
        command.pre_exec(move || {
            sandkasten_jail::namespaces::die_with_parent(parent).map_err(|e| std::io::Error::other(e.to_string()))
        });
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => return ProbeRun::Failed { why: format!("running {}: {error}", qemu_path.display()) },
    };
    let outcome = count_ticks(&mut child);
    let _ = child.kill();
    let _ = child.wait();
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    match outcome {
        Ticks::Counted { after_first, over } => rate(after_first, over),
        Ticks::NoneWithin => {
            ProbeRun::Failed { why: format!("no guest instruction ran within {} s", FIRST_TICK_DEADLINE.as_secs()) }
        }
        Ticks::Exited => {
            let said = stderr.lines().map(str::trim).find(|line| !line.is_empty()).unwrap_or("nothing");
            ProbeRun::Failed { why: format!("QEMU exited before the guest ran; it said: {said}") }
        }
    }
}

/// What the guest's console showed.
enum Ticks {
    /// `after_first` ticks came within `over` after the first.
    Counted { after_first: u64, over: Duration },
    /// No tick before `FIRST_TICK_DEADLINE`.
    NoneWithin,
    /// QEMU ended before the first tick.
    Exited,
}

/// Reads the guest's ticks from QEMU's stdout on a thread (a read cannot time out), timing them here.
fn count_ticks(child: &mut Child) -> Ticks {
    let Some(mut stdout) = child.stdout.take() else { return Ticks::Exited };
    let (sender, receiver) = mpsc::channel();
    let reader = std::thread::Builder::new().name("accel-probe".to_owned()).spawn(move || {
        let mut buffer = [0u8; 4096];
        loop {
            match stdout.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if sender.send((n as u64, Instant::now())).is_err() {
                        break;
                    }
                }
            }
        }
    });
    if reader.is_err() {
        return Ticks::Exited;
    }
    let (first_bytes, first) = match receiver.recv_timeout(FIRST_TICK_DEADLINE) {
        Ok(tick) => tick,
        Err(mpsc::RecvTimeoutError::Timeout) => return Ticks::NoneWithin,
        Err(mpsc::RecvTimeoutError::Disconnected) => return Ticks::Exited,
    };
    let mut after_first = first_bytes - 1;
    let mut last = first;
    loop {
        let left = WINDOW.saturating_sub(first.elapsed());
        if left.is_zero() {
            break;
        }
        match receiver.recv_timeout(left) {
            Ok((bytes, at)) => {
                after_first += bytes;
                last = at;
            }
            Err(_) => break,
        }
    }
    // No tick after the first: the next one is at least the whole window away.
    let over = if after_first == 0 { first.elapsed() } else { last - first };
    Ticks::Counted { after_first, over }
}

/// Loop iterations per second from `ticks` ticks over `over` (an upper bound when no tick came).
fn rate(ticks: u64, over: Duration) -> ProbeRun {
    let seconds = over.as_secs_f64().max(1e-6);
    let iterations = f64::from(PROBE_TICK_ITERATIONS) * ticks.max(1) as f64;
    ProbeRun::Measured { iterations_per_s: iterations / seconds, at_most: ticks == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_firmware_jumps_from_the_reset_vector_to_the_loop() {
        let image = firmware();
        assert_eq!(image.len(), 65536);
        assert_eq!(image[0xFFF0], 0xE9);
        let rel = i16::from_le_bytes([image[0xFFF1], image[0xFFF2]]);
        assert_eq!(0xFFF3 + i32::from(rel), 0xFF00);
        // The loop's jumps land on `mov ecx` and `dec ecx`.
        assert_eq!(&image[0xFF03..0xFF05], &[0x66, 0xB9]);
        assert_eq!(0xFF0B + 2 + i32::from(image[0xFF0C] as i8), 0xFF09);
        assert_eq!(0xFF10 + 2 + i32::from(image[0xFF11] as i8), 0xFF03);
    }

    #[test]
    fn a_window_without_a_second_tick_is_an_upper_bound() {
        let bound = rate(0, Duration::from_millis(500));
        assert_eq!(bound, ProbeRun::Measured { iterations_per_s: 200_000.0, at_most: true });
        let measured = rate(10, Duration::from_secs(1));
        assert_eq!(measured, ProbeRun::Measured { iterations_per_s: 1_000_000.0, at_most: false });
    }
}
