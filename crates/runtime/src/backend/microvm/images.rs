//! The files a microVM boots from. Shared and read-only: the guest kernel, initramfs and template root image that
//! `scripts/setup-microvm.sh` builds into `[microvm] dir`, a built template's image (`template_image`), and the
//! agent's disk (an ext4 image holding this build's
//! `sandkasten` binary, made on first use and cached by the binary's identity). Per sandbox: its writable disk, a
//! sparse ext4 image of the disk limit in the sandbox's own directory.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use sandkasten_types::MicrovmSettings;

use crate::error::RuntimeError;

/// The shared boot files, found where setup put them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BootFiles {
    pub(crate) kernel: PathBuf,
    pub(crate) initrd: PathBuf,
    pub(crate) rootfs: PathBuf,
}

impl BootFiles {
    /// The boot files in `settings.dir`, or what is missing and how to make it.
    pub(crate) fn find(settings: &MicrovmSettings) -> Result<BootFiles, String> {
        let at = |name: &str| settings.dir.join(name);
        let files = BootFiles { kernel: at("vmlinuz"), initrd: at("initrd.img"), rootfs: at("rootfs.ext4") };
        let missing: Vec<String> = [&files.kernel, &files.initrd, &files.rootfs]
            .into_iter()
            .filter(|path| !path.is_file())
            .map(|path| path.display().to_string())
            .collect();
        if missing.is_empty() {
            Ok(files)
        } else {
            Err(format!(
                "isolation \"microvm\" needs a guest kernel and root image, which are missing ({}): \
                 scripts/setup-microvm.sh builds them (scripts/setup.sh runs it)",
                missing.join(", ")
            ))
        }
    }
}

/// Runs a helper program (`mkfs.ext4`), turning a failure into an error that says what it printed.
pub(super) fn run(program: &str, args: &[&std::ffi::OsStr], what: &str) -> Result<(), RuntimeError> {
    let output = Command::new(program)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .map_err(|e| RuntimeError::sys_owned(format!("running {program} ({what}); is e2fsprogs installed?"), e))?;
    if output.status.success() {
        return Ok(());
    }
    Err(RuntimeError::TierFailed(format!(
        "{what}: {program} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    )))
}

/// The agent's disk for the binary at `agent`: `agents/agent-SIZE-MTIME-INODE.ext4` under the microvm dir, made
/// once (in a temporary directory, then renamed into place, so that concurrent first uses never see half of one).
pub(crate) fn agent_disk(settings: &MicrovmSettings, agent: &Path) -> Result<PathBuf, RuntimeError> {
    let meta = std::fs::metadata(agent)
        .map_err(|e| RuntimeError::sys_owned(format!("reading the agent binary {}", agent.display()), e))?;
    let dir = settings.dir.join("agents");
    let image = dir.join(format!(
        "agent-{}-{}-{}.ext4",
        meta.size(),
        meta.mtime_nsec() + meta.mtime() * 1_000_000_000,
        meta.ino()
    ));
    if image.is_file() {
        mark_used(&image);
        return Ok(image);
    }
    prune_unused(&dir, "agent-", AGENT_DISK_UNUSED);
    std::fs::create_dir_all(&dir).map_err(|e| RuntimeError::sys_owned(format!("creating {}", dir.display()), e))?;
    let staging = Staging(dir.join(format!(".build-{}-{}", std::process::id(), crate::ids::new_sandbox_id()?)));
    std::fs::create_dir(&staging.0)
        .map_err(|e| RuntimeError::sys_owned(format!("creating {}", staging.0.display()), e))?;
    let contents = staging.0.join("contents");
    std::fs::create_dir(&contents).map_err(|e| RuntimeError::sys("creating the agent disk's contents", e))?;
    let binary = contents.join("sandkasten");
    // Without its debug information (a debug build's binary is four times the size); a copy where binutils' objcopy
    // is missing.
    let stripped = Command::new("objcopy")
        .arg("--strip-debug")
        .arg(agent)
        .arg(&binary)
        .output()
        .is_ok_and(|output| output.status.success());
    if !stripped {
        std::fs::copy(agent, &binary).map_err(|e| RuntimeError::sys("copying the agent binary", e))?;
    }
    let binary_size = std::fs::metadata(&binary).map_err(|e| RuntimeError::sys("reading the agent copy", e))?.len();
    let built = staging.0.join("agent.ext4");
    let size = binary_size.saturating_mul(11) / 10 + (16 << 20);
    let file = std::fs::File::create(&built).map_err(|e| RuntimeError::sys("creating the agent disk", e))?;
    file.set_len(size).map_err(|e| RuntimeError::sys("sizing the agent disk", e))?;
    drop(file);
    run(
        "mkfs.ext4",
        &[
            "-q".as_ref(),
            "-F".as_ref(),
            "-O".as_ref(),
            "^has_journal".as_ref(),
            "-d".as_ref(),
            contents.as_os_str(),
            built.as_os_str(),
        ],
        "building the microVM agent disk",
    )?;
    std::fs::rename(&built, &image).map_err(|e| RuntimeError::sys("placing the agent disk", e))?;
    Ok(image)
}

/// How long an agent disk no VM started from is kept (older builds' disks; a running VM keeps its open copy).
const AGENT_DISK_UNUSED: std::time::Duration = std::time::Duration::from_secs(3600);

/// Notes that `image` was used now (its mtime), so that pruning keeps it.
pub(super) fn mark_used(image: &Path) {
    let now = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_NOW },
        last_modification: rustix::fs::Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_NOW },
    };
    let _ = rustix::fs::utimensat(rustix::fs::CWD, image, &now, rustix::fs::AtFlags::empty());
}

/// Removes the images in `dir` named `PREFIX….ext4` that no VM started from for `unused` (agent disks, each the size
/// of a build's binary; template images) and staging directories of builds that died.
pub(super) fn prune_unused(dir: &Path, prefix: &str, unused: std::time::Duration) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let old = entry
            .metadata()
            .and_then(|meta| meta.modified())
            .is_ok_and(|modified| modified.elapsed().is_ok_and(|age| age > unused));
        let name = entry.file_name().to_string_lossy().into_owned();
        if old && name.starts_with(prefix) && name.ends_with(".ext4") {
            let _ = std::fs::remove_file(entry.path());
        } else if old && name.starts_with(".build-") {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A directory removed when dropped (a half-built agent disk).
pub(super) struct Staging(pub(super) PathBuf);

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The size of a sandbox's disk image for a disk limit: the limit plus ext4's own metadata (without a journal: its
/// inode tables, ~1.6 %, and bitmaps), so that what the guest can store is the limit within ext4's rounding.
pub(crate) fn disk_image_bytes(disk_bytes: u64) -> u64 {
    disk_bytes.saturating_add(disk_bytes / 32).saturating_add(2 << 20)
}

/// Makes the sandbox's writable disk at `path` (sparse: only what the guest writes takes host disk).
pub(crate) fn make_sandbox_disk(path: &Path, disk_bytes: u64) -> Result<(), RuntimeError> {
    let file = std::fs::File::create(path)
        .map_err(|e| RuntimeError::sys_owned(format!("creating the sandbox disk {}", path.display()), e))?;
    file.set_len(disk_image_bytes(disk_bytes)).map_err(|e| RuntimeError::sys("sizing the sandbox disk", e))?;
    drop(file);
    run(
        "mkfs.ext4",
        &[
            "-q".as_ref(),
            "-F".as_ref(),
            "-m".as_ref(),
            "0".as_ref(),
            "-O".as_ref(),
            "^has_journal".as_ref(),
            "-E".as_ref(),
            "lazy_itable_init=1,nodiscard".as_ref(),
            path.as_os_str(),
        ],
        "formatting the sandbox disk",
    )
}
