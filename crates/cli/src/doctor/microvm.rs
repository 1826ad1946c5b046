//! The microvm tier's checks: QEMU is installed and answers `--version`, the guest kernel, initramfs and root image
//! are where `[microvm] dir` says (`scripts/setup-microvm.sh` builds them), and the acceleration guests get (the
//! runtime's own choice: `[microvm] accel`, for `auto` the speed probe's verdict) is allowed (`allow_emulation`).

use std::process::{Command, Stdio};

use sandkasten_types::{MicrovmAccel, MicrovmSettings};

use super::host;
use super::report::{Check, CheckId};

/// How to install what the tier needs.
const INSTALL: &str = "install QEMU and the guest images for the microvm tier: scripts/setup.sh (it runs \
    scripts/setup-microvm.sh; QEMU comes from bookworm-backports: apt-get install -t bookworm-backports qemu-system-x86)";

/// QEMU found (the configured path, or on PATH) and answering `--version`.
pub fn qemu(settings: &MicrovmSettings) -> Check {
    let name = settings.qemu.to_string_lossy().into_owned();
    let Some(path) = host::which(&name) else {
        return Check::fail(CheckId::Qemu, format!("{name} not found in PATH"), INSTALL);
    };
    let output = Command::new(&path).arg("--version").stdin(Stdio::null()).output();
    match output {
        Ok(output) if output.status.success() => {
            let stdout = String::from_utf8_lossy(&output.stdout);
            let version = stdout.lines().next().unwrap_or_default().trim().to_owned();
            Check::ok(CheckId::Qemu, format!("{}: {version}", path.display()))
        }
        Ok(output) => Check::fail(
            CheckId::Qemu,
            format!("{} --version exited with {}: {}", path.display(), output.status, host::last_line(&output.stderr)),
            INSTALL,
        ),
        Err(error) => Check::fail(CheckId::Qemu, format!("running {}: {error}", path.display()), INSTALL),
    }
}

/// The boot files in `[microvm] dir`.
pub fn boot_files(settings: &MicrovmSettings) -> Check {
    let missing: Vec<&str> = ["vmlinuz", "initrd.img", "rootfs.ext4"]
        .into_iter()
        .filter(|name| !settings.dir.join(name).is_file())
        .collect();
    if missing.is_empty() {
        let stamp = std::fs::read_to_string(settings.dir.join("stamp")).unwrap_or_default();
        let kernel = stamp.split_whitespace().find_map(|field| field.strip_prefix("kernel=")).unwrap_or("a kernel");
        Check::ok(CheckId::MicrovmBoot, format!("{}: {kernel}, initramfs, root image", settings.dir.display()))
    } else {
        Check::fail(CheckId::MicrovmBoot, format!("{} lacks {}", settings.dir.display(), missing.join(", ")), INSTALL)
    }
}

/// The acceleration microVMs get here and why, as the runtime decides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MicrovmChoice {
    /// `kvm` or `tcg`.
    pub accel: MicrovmAccel,
    /// Why, in words (`KVM measured 428× slower than TCG (…)`).
    pub reason: String,
}

/// The runtime's choice for `settings`.
pub fn choice(settings: &MicrovmSettings) -> MicrovmChoice {
    let (accel, reason) = sandkasten_runtime::microvm_accel(settings);
    MicrovmChoice { accel, reason }
}

/// Whether `choice` may run: software emulation only when `[microvm] allow_emulation` allows it.
pub fn acceleration(settings: &MicrovmSettings, choice: &MicrovmChoice) -> Check {
    match choice.accel {
        MicrovmAccel::Tcg if !settings.allow_emulation => Check::fail(
            CheckId::MicrovmAccel,
            format!("software emulation, which [microvm] allow_emulation = false forbids ({})", choice.reason),
            "set [microvm] allow_emulation = true, or run microVMs on a host whose KVM runs guests at hardware speed",
        ),
        MicrovmAccel::Tcg | MicrovmAccel::Auto => {
            Check::ok(CheckId::MicrovmAccel, format!("software emulation (tcg): {}", choice.reason))
        }
        MicrovmAccel::Kvm => Check::ok(CheckId::MicrovmAccel, format!("kvm: {}", choice.reason)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::report::Status;

    #[test]
    fn emulation_is_refused_only_where_allow_emulation_is_false() {
        let tcg = MicrovmChoice { accel: MicrovmAccel::Tcg, reason: "KVM measured 428× slower than TCG".into() };
        let allowed = acceleration(&MicrovmSettings::default(), &tcg);
        assert_eq!(allowed.status, Status::Ok);
        assert_eq!(allowed.detail, "software emulation (tcg): KVM measured 428× slower than TCG");
        let strict = MicrovmSettings { allow_emulation: false, ..MicrovmSettings::default() };
        let refused = acceleration(&strict, &tcg);
        assert_eq!(refused.status, Status::Fail);
        assert!(refused.detail.contains("allow_emulation = false forbids (KVM measured 428×"), "{}", refused.detail);
        let kvm = MicrovmChoice { accel: MicrovmAccel::Kvm, reason: "KVM measured 9× faster than TCG".into() };
        assert_eq!(acceleration(&strict, &kvm).status, Status::Ok);
    }
}
