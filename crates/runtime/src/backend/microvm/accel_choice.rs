//! What `[microvm] accel = "auto"` gives guests: KVM only when the speed probe (`speed_probe`) measured it clearly
//! faster than software emulation (`CLEARLY_FASTER`), else TCG, with the reason in words. The verdict is measured
//! once per host boot, kernel and QEMU binary: it is cached in `[microvm] dir` (`accel-verdict.json`, keyed by
//! them) and in this process, so a sandbox never pays for it after the first on a boot.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sandkasten_types::{MicrovmAccel, MicrovmSettings};
use serde::{Deserialize, Serialize};

use super::speed_probe::{self, ProbeRun};

/// KVM is picked when its guest runs at least this many times as fast as under TCG (hardware KVM: ~10×).
pub const CLEARLY_FASTER: f64 = 2.0;

/// Bumped when the probe changes, so that verdicts of an older probe are measured again.
const PROBE_VERSION: u32 = 1;

/// The cache file's name in `[microvm] dir`.
const CACHE_FILE: &str = "accel-verdict.json";

/// What the speed probe measured on this host and the acceleration `auto` picks from it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AccelVerdict {
    /// `kvm` or `tcg` (never `auto`).
    pub accel: MicrovmAccel,
    /// Why, in words: `KVM measured 240× slower than TCG (…)`.
    pub reason: String,
    /// The guest under `-accel kvm`.
    pub kvm: ProbeRun,
    /// The guest under TCG.
    pub tcg: ProbeRun,
}

/// The choice from the two runs: KVM only when it ran and was at least `CLEARLY_FASTER` times as fast as TCG (or
/// TCG could not run at all).
pub fn decide(kvm: ProbeRun, tcg: ProbeRun) -> AccelVerdict {
    let (accel, reason) = match (&kvm, &tcg) {
        (ProbeRun::Failed { why }, _) => (MicrovmAccel::Tcg, format!("KVM is not usable here: {why}")),
        (ProbeRun::Measured { .. }, ProbeRun::Failed { why }) => {
            (MicrovmAccel::Kvm, format!("KVM ran the probe guest and TCG did not ({why})"))
        }
        (
            ProbeRun::Measured { iterations_per_s: kvm_rate, at_most },
            ProbeRun::Measured { iterations_per_s: tcg_rate, .. },
        ) => {
            let speeds = format!(
                "guest loop: KVM {}{} M, TCG {} M iterations/s",
                if *at_most { "at most " } else { "" },
                millions(*kvm_rate),
                millions(*tcg_rate)
            );
            let ratio = kvm_rate / tcg_rate.max(f64::MIN_POSITIVE);
            if ratio >= CLEARLY_FASTER && !at_most {
                (MicrovmAccel::Kvm, format!("KVM measured {} faster than TCG ({speeds})", times(ratio)))
            } else if ratio < 1.0 {
                let bound = if *at_most { "at least " } else { "" };
                (MicrovmAccel::Tcg, format!("KVM measured {bound}{} slower than TCG ({speeds})", times(1.0 / ratio)))
            } else {
                (
                    MicrovmAccel::Tcg,
                    format!(
                        "KVM measured only {} faster than TCG, not clearly faster (KVM is picked from {}) ({speeds})",
                        times(ratio),
                        times(CLEARLY_FASTER)
                    ),
                )
            }
        }
    };
    AccelVerdict { accel, reason, kvm, tcg }
}

/// `240×`, `1.4×`.
fn times(ratio: f64) -> String {
    if ratio >= 10.0 { format!("{ratio:.0}×") } else { format!("{ratio:.1}×") }
}

/// Iterations per second in millions, to two significant places at least.
fn millions(rate: f64) -> String {
    let m = rate / 1e6;
    if m >= 10.0 { format!("{m:.0}") } else { format!("{m:.2}") }
}

/// The host, kernel and QEMU binary a verdict holds for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ProbeKey {
    probe: u32,
    /// `/proc/sys/kernel/random/boot_id`: a new boot measures again.
    boot_id: String,
    /// The host kernel's release.
    kernel: String,
    /// QEMU's path, size, mtime and inode.
    qemu: String,
}

impl ProbeKey {
    fn of(qemu: &Path) -> ProbeKey {
        let read = |path: &str| std::fs::read_to_string(path).map(|s| s.trim().to_owned()).unwrap_or_default();
        let qemu_identity = match std::fs::metadata(qemu) {
            Ok(meta) => format!("{} {} {} {}", qemu.display(), meta.size(), meta.mtime(), meta.ino()),
            Err(_) => qemu.display().to_string(),
        };
        ProbeKey {
            probe: PROBE_VERSION,
            boot_id: read("/proc/sys/kernel/random/boot_id"),
            kernel: read("/proc/sys/kernel/osrelease"),
            qemu: qemu_identity,
        }
    }
}

/// A verdict as cached, with what it holds for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Cached {
    key: ProbeKey,
    verdict: AccelVerdict,
}

/// The verdict of this process (the probe runs under its lock, so once per process at most).
static MEMO: Mutex<Option<Cached>> = Mutex::new(None);

/// The verdict for the QEMU at `qemu` with `settings`' cache dir: remembered, cached on disk, or measured now (about
/// a second, once per boot).
pub fn verdict(settings: &MicrovmSettings, qemu: &Path) -> AccelVerdict {
    let key = ProbeKey::of(qemu);
    let mut memo = MEMO.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(cached) = memo.as_ref().filter(|cached| cached.key == key) {
        return cached.verdict.clone();
    }
    let cache = settings.dir.join(CACHE_FILE);
    let on_disk = std::fs::read(&cache)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Cached>(&bytes).ok())
        .filter(|cached| cached.key == key);
    let cached = match on_disk {
        Some(cached) => cached,
        None => {
            let cached = Cached { key, verdict: measure(qemu) };
            store(&cache, &cached);
            cached
        }
    };
    let verdict = cached.verdict.clone();
    *memo = Some(cached);
    verdict
}

/// Runs the probe guest under both accelerations now.
pub fn measure(qemu: &Path) -> AccelVerdict {
    let Some(firmware) = Firmware::write() else {
        let why = "the probe's firmware could not be written to the temporary directory".to_owned();
        return decide(ProbeRun::Failed { why: why.clone() }, ProbeRun::Failed { why });
    };
    let kvm = if Path::new("/dev/kvm").exists() {
        speed_probe::run(qemu, &firmware.0, MicrovmAccel::Kvm)
    } else {
        ProbeRun::Failed { why: "this host has no /dev/kvm".to_owned() }
    };
    let tcg = speed_probe::run(qemu, &firmware.0, MicrovmAccel::Tcg);
    decide(kvm, tcg)
}

/// Writes `cached` to `path` whole (a temporary file renamed over it); a cache that cannot be written is measured
/// again next time.
fn store(path: &Path, cached: &Cached) {
    let Ok(json) = serde_json::to_vec_pretty(cached) else { return };
    let staging = path.with_extension(format!("{}.tmp", std::process::id()));
    let written = std::fs::write(&staging, json).and_then(|()| std::fs::rename(&staging, path));
    if let Err(error) = written {
        let _ = std::fs::remove_file(&staging);
        tracing::warn!(path = %path.display(), %error, "the microVM speed verdict could not be cached");
    }
}

/// What the probe's firmware files are called: `PREFIX<pid>-<ns>.rom`, the pid the process that wrote it.
const FIRMWARE_PREFIX: &str = "sandkasten-accel-probe-";

/// Removes the firmware files in `dir` of processes that no longer run (a server killed while it probed).
fn sweep_stale_firmware(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(FIRMWARE_PREFIX)
            .filter(|rest| rest.ends_with(".rom"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The probe's firmware image in a file of its own, removed on drop.
struct Firmware(PathBuf);

impl Firmware {
    fn write() -> Option<Firmware> {
        use std::io::Write as _;
        let dir = std::env::temp_dir();
        sweep_stale_firmware(&dir);
        let path =
            dir.join(format!("{FIRMWARE_PREFIX}{}-{}.rom", std::process::id(), sandkasten_protocol::monotonic_ns()));
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(&path).ok()?;
        let firmware = Firmware(path);
        file.write_all(&speed_probe::firmware()).ok()?;
        Some(firmware)
    }
}

impl Drop for Firmware {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(million_per_s: f64) -> ProbeRun {
        ProbeRun::Measured { iterations_per_s: million_per_s * 1e6, at_most: false }
    }

    #[test]
    fn emulated_kvm_hundreds_of_times_slower_than_tcg_gives_tcg_saying_how_much() {
        let verdict = decide(measured(1.0), measured(240.0));
        assert_eq!(verdict.accel, MicrovmAccel::Tcg);
        assert!(verdict.reason.starts_with("KVM measured 240× slower than TCG"), "{}", verdict.reason);
        assert!(verdict.reason.contains("KVM 1.00 M, TCG 240 M iterations/s"), "{}", verdict.reason);
        let bound = decide(ProbeRun::Measured { iterations_per_s: 2e5, at_most: true }, measured(300.0));
        assert_eq!(bound.accel, MicrovmAccel::Tcg);
        assert!(bound.reason.starts_with("KVM measured at least 1500× slower"), "{}", bound.reason);
    }

    #[test]
    fn hardware_kvm_clearly_faster_gives_kvm() {
        let verdict = decide(measured(3000.0), measured(300.0));
        assert_eq!(verdict.accel, MicrovmAccel::Kvm);
        assert!(verdict.reason.starts_with("KVM measured 10× faster than TCG"), "{}", verdict.reason);
    }

    #[test]
    fn kvm_only_a_little_faster_is_not_clearly_faster() {
        let verdict = decide(measured(450.0), measured(300.0));
        assert_eq!(verdict.accel, MicrovmAccel::Tcg);
        assert!(verdict.reason.contains("only 1.5× faster than TCG, not clearly faster"), "{}", verdict.reason);
        assert_eq!(decide(measured(600.0), measured(300.0)).accel, MicrovmAccel::Kvm, "2× is clearly faster");
    }

    #[test]
    fn kvm_that_cannot_run_gives_tcg_and_tcg_that_cannot_gives_kvm() {
        let broken = ProbeRun::Failed { why: "QEMU exited before the guest ran; it said: failed to set MSR".into() };
        let verdict = decide(broken.clone(), measured(300.0));
        assert_eq!(verdict.accel, MicrovmAccel::Tcg);
        assert!(verdict.reason.starts_with("KVM is not usable here: QEMU exited"), "{}", verdict.reason);
        assert_eq!(decide(measured(3000.0), broken.clone()).accel, MicrovmAccel::Kvm);
        assert_eq!(decide(broken.clone(), broken).accel, MicrovmAccel::Tcg);
    }

    #[test]
    fn a_verdict_holds_for_one_boot_kernel_and_qemu_binary() {
        let key = ProbeKey::of(Path::new("/bin/sh"));
        assert!(!key.boot_id.is_empty() && !key.kernel.is_empty(), "{key:?}");
        assert_eq!(key, ProbeKey::of(Path::new("/bin/sh")));
        assert_ne!(key.qemu, ProbeKey::of(Path::new("/bin/true")).qemu);
        let json = serde_json::to_vec(&Cached { key: key.clone(), verdict: decide(measured(1.0), measured(2.0)) });
        let back: Option<Cached> = json.ok().and_then(|json| serde_json::from_slice(&json).ok());
        assert_eq!(back.map(|cached| cached.key), Some(key));
    }

    /// The real probe on this host: TCG always runs; on `kvm_pvm` (KVM on emulated nested virtualisation) KVM must
    /// be measured slower than TCG and `auto` must say TCG with how much slower.
    #[test]
    fn firmware_of_processes_that_are_gone_is_swept_and_a_running_one_s_kept() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let mut child = std::process::Command::new("true").spawn()?;
        let gone = child.id();
        child.wait()?;
        let stale = dir.path().join(format!("{FIRMWARE_PREFIX}{gone}-1.rom"));
        let live = dir.path().join(format!("{FIRMWARE_PREFIX}{}-2.rom", std::process::id()));
        let other = dir.path().join(format!("{FIRMWARE_PREFIX}{gone}-3.txt"));
        for path in [&stale, &live, &other] {
            std::fs::write(path, b"rom")?;
        }
        sweep_stale_firmware(dir.path());
        assert!(!stale.exists(), "a dead server's firmware is removed");
        assert!(live.exists() && other.exists(), "a running probe's file and other names are kept");
        Ok(())
    }

    #[test]
    fn the_real_probe_measures_both_accelerations() {
        let Some(qemu) = crate::backend::resolve_program(Path::new("qemu-system-x86_64")) else {
            eprintln!("skipped: qemu-system-x86_64 is not installed (scripts/setup.sh installs it)");
            return;
        };
        let started = std::time::Instant::now();
        let verdict = measure(&qemu);
        eprintln!("{verdict:?}");
        assert!(started.elapsed() < std::time::Duration::from_secs(15), "the probe took {:?}", started.elapsed());
        assert!(matches!(verdict.tcg, ProbeRun::Measured { at_most: false, .. }), "{verdict:?}");
        if Path::new("/sys/module/kvm_pvm").exists() {
            assert_eq!(verdict.accel, MicrovmAccel::Tcg, "{verdict:?}");
            assert!(verdict.reason.contains("slower than TCG"), "{verdict:?}");
        }
        let leftovers = std::fs::read_dir(std::env::temp_dir())
            .map(|dir| {
                dir.flatten()
                    .filter(|e| {
                        e.file_name().to_string_lossy().contains(&format!("accel-probe-{}-", std::process::id()))
                    })
                    .count()
            })
            .unwrap_or(0);
        assert_eq!(leftovers, 0, "the probe's firmware file is removed");
    }
}
