//! The microvm tier's checks: QEMU is installed and answers `--version`, and the guest kernel, initramfs and root
//! image are where the default `[microvm] dir` says (`scripts/setup-microvm.sh` builds them). Whether guests run
//! under KVM or software emulation is the KVM checks' matter (`kvm`), reported in the tier's verdict.

use std::process::{Command, Stdio};

use sandkasten_types::MicrovmSettings;

use super::host;
use super::report::{Check, CheckId};

/// How to install what the tier needs.
const INSTALL: &str = "install QEMU and the guest images for the microvm tier: scripts/setup.sh (it runs \
    scripts/setup-microvm.sh; QEMU comes from bookworm-backports: apt-get install -t bookworm-backports qemu-system-x86)";

/// QEMU found on PATH and answering `--version`.
pub fn qemu() -> Check {
    let settings = MicrovmSettings::default();
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

/// The boot files in the default `[microvm] dir`.
pub fn boot_files() -> Check {
    let settings = MicrovmSettings::default();
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
