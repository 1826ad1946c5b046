//! Memory snapshots of microVMs through QEMU's migration to a file. Saving: `stop` (the vCPUs and the guest's clocks
//! stop), `migrate` into `vm.qemu` in the caller's directory (the descriptor is passed over the monitor with
//! `add-fd`: the VMM's jail has no path to the directory), a copy of the sandbox's writable disk taken while the VM
//! is stopped (`disk.qcow2`: only the blocks the guest wrote, as `qemu-img convert` finds them), the VM's shape and
//! the images it was started from (`vm.json`), then `cont` — or nothing, for a pause that releases the VM. Restoring:
//! the disk is copied back into the new sandbox's directory (sparse), a VMM with the same machine and devices starts
//! with `-incoming` on the memory file, and once it is loaded the spawner says `cont`; the guest's agent goes on
//! behind a new channel (its virtio-serial port stays open: QEMU's port state travels with the memory).
//!
//! The plain migration stream, not `mapped-ram`: the stream holds only the pages the guest touched (zero pages are a
//! flag), so the file the snapshot store compresses and the one a restore writes back are small, while a mapped-ram
//! file is the guest's RAM size with holes that the store would read and write in full. mapped-ram's gain, loading
//! pages in parallel with multifd, is small on a software-emulated host with two cores.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::qemu::{OUTGOING_FDSET, VmShape};
use super::{MicrovmFiles, lost_words, monitor, monitor_failed, qmp};
use crate::error::RuntimeError;

/// The migration stream (the guest's memory and device state).
const MEMORY_FILE: &str = "vm.qemu";
/// The sandbox's writable disk as it was, as qcow2.
const DISK_FILE: &str = "disk.qcow2";
/// What the VM was (`SavedConfig`).
const CONFIG_FILE: &str = "vm.json";

/// How long saving a VM's memory may take.
const SAVE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a new VMM may take to load a snapshot's memory before it answers on its monitor.
const LOAD_TIMEOUT: Duration = Duration::from_secs(120);
/// How often a migration's progress is asked for.
const MIGRATION_POLL: Duration = Duration::from_millis(10);

/// What the VM does once its memory is saved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterSave {
    /// `cont`: it runs on (a memory snapshot).
    Continue,
    /// It stays stopped (a pause that releases the VM: the caller ends the VMM). The disk is not copied: the
    /// sandbox's own stays as it was, for the resume.
    StayStopped,
}

/// The VM a snapshot was taken of: a restore needs the same machine, devices and images.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(super) struct SavedConfig {
    pub(super) shape: VmShape,
    /// Whether it had the egress door's port.
    pub(super) door: bool,
    /// The agent disk it booted with (named by the agent binary's identity): the guest reads from it after a restore.
    pub(super) agent_disk: String,
    /// The template root image's size and modification time: the guest reads from it too.
    pub(super) rootfs: String,
}

/// Saves the running VM of `files` into `dir` (created 0700; its files 0600); `after` says whether it runs on. When
/// saving fails, the VM runs on.
pub(super) fn save(files: &MicrovmFiles, dir: &Path, after: AfterSave) -> Result<(), RuntimeError> {
    let config = read_config(&files.config())?;
    make_private_dir(dir)?;
    let started = Instant::now();
    let mut monitor = monitor(files)?;
    monitor.execute("stop", Value::Null).map_err(|e| monitor_failed(files, e))?;
    let saved = save_stopped(files, &mut monitor, dir, &config, after == AfterSave::Continue);
    if after == AfterSave::Continue || saved.is_err() {
        let continued = monitor.execute("cont", Value::Null).map_err(|e| monitor_failed(files, e));
        saved?;
        continued?;
    }
    tracing::info!(dir = %dir.display(), ms = started.elapsed().as_millis() as u64, "microVM memory saved");
    Ok(())
}

fn save_stopped(
    files: &MicrovmFiles,
    monitor: &mut qmp::Qmp,
    dir: &Path,
    config: &SavedConfig,
    with_disk: bool,
) -> Result<(), RuntimeError> {
    let memory = private_file(&dir.join(MEMORY_FILE))?;
    // A set left by an earlier save that failed half-way.
    let _ = monitor.execute("remove-fd", json!({ "fdset-id": OUTGOING_FDSET }));
    monitor
        .execute_with_fd("add-fd", json!({ "fdset-id": OUTGOING_FDSET }), memory.as_fd())
        .map_err(|e| monitor_failed(files, e))?;
    drop(memory);
    let migrated = monitor
        .execute("migrate", json!({ "uri": format!("file:/dev/fdset/{OUTGOING_FDSET}") }))
        .map_err(|e| monitor_failed(files, e))
        .and_then(|_| wait_for_migration(files, monitor, SAVE_TIMEOUT));
    let _ = monitor.execute("remove-fd", json!({ "fdset-id": OUTGOING_FDSET }));
    migrated?;
    if with_disk {
        copy_disk(&files.disk(), "raw", &dir.join(DISK_FILE), "qcow2")?;
    }
    write_config(&dir.join(CONFIG_FILE), config)
}

/// Writes what a VM is (`SavedConfig`) to `path`, 0600: at its start into its directory, and into each snapshot.
pub(super) fn write_config(path: &Path, config: &SavedConfig) -> Result<(), RuntimeError> {
    let text = serde_json::to_vec(config)
        .map_err(|e| RuntimeError::sys("encoding the VM's config", std::io::Error::other(e)))?;
    std::io::Write::write_all(&mut private_file(path)?, &text)
        .map_err(|e| RuntimeError::sys_owned(format!("writing {}", path.display()), e))
}

fn read_config(path: &Path) -> Result<SavedConfig, RuntimeError> {
    let text = std::fs::read(path).map_err(|e| RuntimeError::sys_owned(format!("reading {}", path.display()), e))?;
    serde_json::from_slice(&text).map_err(|e| RuntimeError::TierFailed(format!("{} is damaged: {e}", path.display())))
}

/// Waits until the migration in progress on `monitor` completes; its error when it fails.
fn wait_for_migration(files: &MicrovmFiles, monitor: &mut qmp::Qmp, timeout: Duration) -> Result<(), RuntimeError> {
    let deadline = Instant::now() + timeout;
    loop {
        let state = monitor.execute("query-migrate", Value::Null).map_err(|e| monitor_failed(files, e))?;
        match state.get("status").and_then(Value::as_str) {
            Some("completed") => return Ok(()),
            Some(status @ ("failed" | "cancelled")) => {
                let why = state.get("error-desc").and_then(Value::as_str).unwrap_or(status);
                return Err(RuntimeError::TierFailed(lost_words(&format!("the migration failed: {why}"), files)));
            }
            _ if Instant::now() >= deadline => {
                let _ = monitor.execute("migrate_cancel", Value::Null);
                return Err(RuntimeError::TierFailed(format!("the migration took longer than {timeout:?}")));
            }
            _ => std::thread::sleep(MIGRATION_POLL),
        }
    }
}

/// A memory snapshot of a microVM in a directory.
pub(super) struct SavedVm {
    dir: PathBuf,
    pub(super) config: SavedConfig,
}

impl SavedVm {
    /// The snapshot in `dir`, or why it is none.
    pub(super) fn open(dir: &Path) -> Result<SavedVm, RuntimeError> {
        SavedVm::open_holding(dir, &[MEMORY_FILE, DISK_FILE])
    }

    /// The memory of a VM paused in `dir` (`AfterSave::StayStopped`: no disk).
    pub(super) fn open_paused(dir: &Path) -> Result<SavedVm, RuntimeError> {
        SavedVm::open_holding(dir, &[MEMORY_FILE])
    }

    fn open_holding(dir: &Path, names: &[&str]) -> Result<SavedVm, RuntimeError> {
        let not_one = |what: &str| {
            RuntimeError::InvalidInput(format!("{} holds no microVM memory snapshot ({what})", dir.display()))
        };
        for name in names {
            if !dir.join(name).is_file() {
                return Err(not_one(&format!("{name} is missing")));
            }
        }
        let text = std::fs::read(dir.join(CONFIG_FILE)).map_err(|_| not_one(&format!("{CONFIG_FILE} is missing")))?;
        let config = serde_json::from_slice(&text).map_err(|e| not_one(&format!("{CONFIG_FILE} is damaged: {e}")))?;
        Ok(SavedVm { dir: dir.to_owned(), config })
    }

    /// Refuses a restore into a VM that differs from the saved one in what the guest depends on.
    pub(super) fn check_matches(&self, now: &SavedConfig) -> Result<(), RuntimeError> {
        let saved = &self.config;
        let differs = if (saved.shape.memory_mib, saved.shape.vcpus) != (now.shape.memory_mib, now.shape.vcpus) {
            Some("its memory or CPU limits differ".to_owned())
        } else if saved.shape.accel != now.shape.accel {
            Some(format!("it ran under {:?} and this host's VMs run under {:?}", saved.shape.accel, now.shape.accel))
        } else if saved.door != now.door {
            Some("it had a different egress door".to_owned())
        } else if saved.agent_disk != now.agent_disk {
            Some("it was taken by another build of sandkasten (its guest agent differs)".to_owned())
        } else if saved.rootfs != now.rootfs {
            Some("the guest root image was rebuilt since (scripts/setup-microvm.sh)".to_owned())
        } else {
            None
        };
        match differs {
            Some(why) => Err(RuntimeError::InvalidInput(format!(
                "this microVM memory snapshot cannot be restored here: {why}; take a new snapshot"
            ))),
            None => Ok(()),
        }
    }

    /// Writes the saved disk to `disk` (raw, sparse). The image is read by `qemu-img` as the host's root, so one
    /// whose qcow2 header names another file (a backing file or an external data file: any host path) is refused
    /// before anything reads its data.
    pub(super) fn copy_disk_to(&self, disk: &Path) -> Result<(), RuntimeError> {
        let saved = self.dir.join(DISK_FILE);
        refuse_foreign_files(&saved)?;
        copy_disk(&saved, "qcow2", disk, "raw").map_err(|error| {
            RuntimeError::InvalidInput(format!("the memory snapshot's disk cannot be read ({error}): it is damaged"))
        })
    }

    /// The memory file, open for the new VMM.
    pub(super) fn memory_file(&self) -> Result<File, RuntimeError> {
        let path = self.dir.join(MEMORY_FILE);
        File::open(&path).map_err(|e| RuntimeError::sys_owned(format!("opening {}", path.display()), e))
    }
}

/// Waits until the new VMM of `files` has loaded its memory file, then says `cont`. A file QEMU cannot load (damaged,
/// truncated) makes it exit: the error says what it said.
pub(super) fn continue_loaded(files: &MicrovmFiles) -> Result<(), RuntimeError> {
    let loaded = qmp::Qmp::connect_within(&files.monitor(), LOAD_TIMEOUT)
        .map_err(|e| monitor_failed(files, e))
        .and_then(|mut monitor| {
            wait_for_migration(files, &mut monitor, LOAD_TIMEOUT)?;
            monitor.execute("cont", Value::Null).map_err(|e| monitor_failed(files, e))?;
            // The vCPUs run once QEMU says so.
            monitor.wait_for_event("RESUME", qmp::COMMAND_TIMEOUT).map_err(|e| monitor_failed(files, e))
        });
    match loaded {
        Ok(_) => Ok(()),
        Err(error) => Err(RuntimeError::TierFailed(format!(
            "the VM could not load the memory snapshot (is it damaged or truncated?): {error}"
        ))),
    }
}

/// Refuses a qcow2 image that is not self-contained: `qemu-img info` (which opens no backing file) must report
/// neither a backing file nor an external data file.
fn refuse_foreign_files(image: &Path) -> Result<(), RuntimeError> {
    let output = std::process::Command::new("qemu-img")
        .args(["info", "-U", "--output=json", "-f", "qcow2"])
        .arg(image)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .map_err(|e| RuntimeError::sys("running qemu-img (is qemu-utils installed?)", e))?;
    let damaged = |why: String| {
        RuntimeError::InvalidInput(format!("the memory snapshot's disk cannot be read ({why}): it is damaged"))
    };
    if !output.status.success() {
        return Err(damaged(String::from_utf8_lossy(&output.stderr).trim().to_owned()));
    }
    let info: Value = serde_json::from_slice(&output.stdout).map_err(|e| damaged(format!("qemu-img info: {e}")))?;
    let backing = info.get("backing-filename").or_else(|| info.get("full-backing-filename"));
    let data_file = info.pointer("/format-specific/data/data-file");
    match (backing, data_file) {
        (None, None) => Ok(()),
        _ => Err(RuntimeError::InvalidInput(
            "the memory snapshot's disk names another file (a qcow2 backing or data file): refused, a snapshot's \
             disk holds its data itself; take a new snapshot"
                .to_owned(),
        )),
    }
}

/// Copies a disk image with `qemu-img convert` (only allocated blocks are read; zeros are written as holes).
fn copy_disk(from: &Path, from_format: &str, to: &Path, to_format: &str) -> Result<(), RuntimeError> {
    let output = std::process::Command::new("qemu-img")
        .args(["convert", "-U", "-f", from_format, "-O", to_format])
        .arg(from)
        .arg(to)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .map_err(|e| RuntimeError::sys("running qemu-img (is qemu-utils installed?)", e))?;
    if !output.status.success() {
        return Err(RuntimeError::TierFailed(format!(
            "copying the disk {} failed: {}",
            from.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let _ = std::fs::set_permissions(to, std::os::unix::fs::PermissionsExt::from_mode(0o600));
    Ok(())
}

/// Creates `dir` 0700 (its parents as needed).
fn make_private_dir(dir: &Path) -> Result<(), RuntimeError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| RuntimeError::sys_owned(format!("creating {}", dir.display()), e))
}

/// Creates `path` for writing, 0600, replacing what was there.
fn private_file(path: &Path) -> Result<File, RuntimeError> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| RuntimeError::sys_owned(format!("creating {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandkasten_types::MicrovmAccel;

    fn config() -> SavedConfig {
        SavedConfig {
            shape: VmShape { accel: MicrovmAccel::Tcg, memory_mib: 256, vcpus: 1, tsc_khz: 2_000_000 },
            door: true,
            agent_disk: "agent-1-2-3.ext4".into(),
            rootfs: "100-200".into(),
        }
    }

    #[test]
    fn a_snapshot_restores_only_into_the_same_vm() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let missing = SavedVm::open(dir.path()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(missing.contains("holds no microVM memory snapshot (vm.qemu is missing)"), "{missing}");
        for name in [MEMORY_FILE, DISK_FILE] {
            std::fs::write(dir.path().join(name), b"x").unwrap_or_else(|e| panic!("{e}"));
        }
        std::fs::write(dir.path().join(CONFIG_FILE), b"{\"shape\":").unwrap_or_else(|e| panic!("{e}"));
        let damaged = SavedVm::open(dir.path()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(damaged.contains("vm.json is damaged"), "{damaged}");
        std::fs::write(dir.path().join(CONFIG_FILE), serde_json::to_vec(&config()).unwrap_or_default())
            .unwrap_or_else(|e| panic!("{e}"));
        let saved = SavedVm::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        let tsc_moved = SavedConfig { shape: VmShape { tsc_khz: 2_000_001, ..config().shape }, ..config() };
        assert!(saved.check_matches(&tsc_moved).is_ok(), "the clock's rate is the saved kernel's business");
        let rebuilt = SavedConfig { agent_disk: "agent-9-9-9.ext4".into(), ..config() };
        let refused = saved.check_matches(&rebuilt).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            refused.contains("another build of sandkasten") && refused.contains("take a new snapshot"),
            "{refused}"
        );
        let bigger = SavedConfig { shape: VmShape { memory_mib: 512, ..config().shape }, ..config() };
        assert!(saved.check_matches(&bigger).is_err());
    }

    /// A snapshot disk whose qcow2 header points at a host file must not bring that file's bytes into a guest.
    #[test]
    fn a_snapshot_disk_naming_a_host_file_is_refused_and_copies_nothing() {
        if std::process::Command::new("qemu-img").arg("--version").output().is_err() {
            eprintln!("skipped: qemu-img is not installed (scripts/setup.sh installs it)");
            return;
        }
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let canary = dir.path().join("host-secret");
        std::fs::write(&canary, b"host canary 5f3a9c").unwrap_or_else(|e| panic!("{e}"));
        let qemu_img = |args: &[String]| {
            let status = std::process::Command::new("qemu-img").args(args).status().unwrap_or_else(|e| panic!("{e}"));
            assert!(status.success(), "qemu-img {args:?}");
        };
        let canary_path = canary.to_string_lossy().into_owned();
        // A backing file, and an external raw data file (the image's clusters would be the host file's bytes).
        for (case, options) in [
            ("backing file", vec!["-F".to_owned(), "raw".to_owned(), "-b".to_owned(), canary_path.clone()]),
            ("data file", vec!["-o".to_owned(), format!("data_file={canary_path},data_file_raw=on")]),
        ] {
            let snapshot = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
            let image = snapshot.path().join(DISK_FILE).to_string_lossy().into_owned();
            let mut args: Vec<String> = ["create", "-q", "-f", "qcow2"].map(str::to_owned).to_vec();
            args.extend(options);
            args.extend([image, "1M".to_owned()]);
            qemu_img(&args);
            for name in [MEMORY_FILE, CONFIG_FILE] {
                std::fs::write(snapshot.path().join(name), b"{}").unwrap_or_else(|e| panic!("{e}"));
            }
            let saved = SavedVm { dir: snapshot.path().to_owned(), config: config() };
            let target = snapshot.path().join("disk.raw");
            let refused = saved.copy_disk_to(&target).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(refused.contains("names another file"), "{case}: {refused}");
            assert!(!target.exists(), "{case}: nothing was copied");
        }
        // Control: a self-contained image is copied.
        let snapshot = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let image = snapshot.path().join(DISK_FILE).to_string_lossy().into_owned();
        qemu_img(&["create", "-q", "-f", "qcow2", &image, "1M"].map(str::to_owned));
        let saved = SavedVm { dir: snapshot.path().to_owned(), config: config() };
        let target = snapshot.path().join("disk.raw");
        saved.copy_disk_to(&target).unwrap_or_else(|e| panic!("{e}"));
        assert!(target.exists());
    }
}
