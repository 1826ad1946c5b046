//! A microVM pause that releases the VM (`[microvm] release_paused`, the default): `release` saves the guest's memory
//! and devices into `paused/` in the sandbox's directory (`memory::save`, the VM left stopped, the disk where it is)
//! and ends the VMM with its cgroup, so the paused sandbox holds host disk only; `restart` makes the cgroup again
//! and starts a VMM that loads that file (`-incoming`), with new channels to the runtime, then `cont`. The pause in
//! place (QMP `stop` under the freezer) is in `mod.rs`.

use std::os::unix::net::UnixStream;

use super::{MicrovmFiles, MicrovmTier, memory};
use crate::error::RuntimeError;
use crate::guard::SandboxGuard;

/// Saves the VM's memory into `files.paused()` and ends the VMM: nothing of the sandbox runs, its cgroup is removed
/// (what it used so far is kept), and its disk stays as the stopped guest left it. When saving fails, the VM runs on.
pub(super) fn release(guard: &mut SandboxGuard, files: &MicrovmFiles) -> Result<(), RuntimeError> {
    let started = std::time::Instant::now();
    let _ = std::fs::remove_dir_all(files.paused());
    if let Err(error) = memory::save(files, &files.paused(), memory::AfterSave::StayStopped) {
        let _ = std::fs::remove_dir_all(files.paused());
        return Err(error);
    }
    guard.kill();
    guard.reap();
    let _ = std::fs::remove_file(files.monitor());
    if let Some(vm) = &mut guard.microvm {
        vm.released = true;
    }
    let so_far = guard.usage();
    if let Some(cgroup) = guard.cgroup.clone() {
        match cgroup.remove() {
            Ok(()) => {
                guard.cgroup = None;
                guard.earlier_usage = so_far;
            }
            Err(error) => tracing::warn!(%error, sandbox = %guard.id, "removing a released microVM's cgroup failed"),
        }
    }
    tracing::info!(sandbox = %guard.id, ms = started.elapsed().as_millis() as u64, "microVM released");
    Ok(())
}

/// Starts the released VM of `guard` again from `files.paused()`, in a new cgroup with its limits; the host end
/// of its new channel (the door's new host end goes in `guard.door`). On error the caller destroys the sandbox.
pub(super) fn restart(
    tier: &MicrovmTier<'_>,
    guard: &mut SandboxGuard,
    files: &MicrovmFiles,
) -> Result<UnixStream, RuntimeError> {
    let started = std::time::Instant::now();
    let launch = files.launch.clone().ok_or_else(|| {
        RuntimeError::InvalidInput(format!("sandbox {} cannot be resumed: its start is unknown", guard.id))
    })?;
    let (spec, plan) = (&launch.0, &launch.1);
    let saved = memory::SavedVm::open_paused(&files.paused())?;
    if guard.cgroup.is_none() {
        tier.launcher.recreate_cgroup(guard)?;
    }
    let memory_file = saved.memory_file()?;
    let mut vm = tier.start_vm(guard, spec, plan, files, saved.config.shape, Some(&memory_file))?;
    drop(memory_file);
    memory::continue_loaded(files)?;
    if let Some(vm) = &mut guard.microvm {
        vm.released = false;
    }
    guard.door = vm.door.take();
    if let Err(error) = std::fs::remove_dir_all(files.paused()) {
        tracing::warn!(%error, sandbox = %guard.id, "removing a resumed microVM's saved memory failed");
    }
    tracing::info!(sandbox = %guard.id, ms = started.elapsed().as_millis() as u64, "microVM resumed from its saved memory");
    Ok(vm.channel)
}
