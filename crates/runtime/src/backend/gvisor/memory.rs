//! Memory snapshots of gVisor sandboxes: `runsc checkpoint --leave-running` saves a running sandbox's whole state (the
//! Sentry's memory: processes, tmpfs files, open files, the agent) into a directory the caller owns while the sandbox
//! goes on, and a new sandbox (its own id, cgroup, bundle and channel) starts from such an image with `runsc
//! restore`, started like `runsc run` (`runsc::start`). The new sandbox's bundle is written from its own spec, which
//! must be the source's (same home, limits of the mounts, door or not): runsc restores the mounts the image has.
//! The caller quiesces the source's agent first (no partial frame, no host connection in the image) and sends the
//! copy's agent `Resumed` first. The directory is the caller's: nothing here removes it.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Instant;

use super::GvisorFiles;
use super::checkpoint::{make_private_dir, runsc, wait_until_running};
use crate::config::RuntimeConfig;
use crate::error::RuntimeError;
use crate::guard::SandboxGuard;

/// Saves the running sandbox of `guard` into `dir` (created with mode 0700; an image there is replaced); the sandbox
/// keeps running (runsc stops it for the time of the save).
pub(super) fn snapshot(guard: &SandboxGuard, dir: &Path) -> Result<(), RuntimeError> {
    let id = &guard.id;
    let files = match &guard.gvisor {
        Some(files) if guard.init_pid.is_some() && !files.checkpointed => files,
        _ => return Err(RuntimeError::InvalidInput(format!("sandbox {id} is not running (paused?)"))),
    };
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| RuntimeError::sys_owned(format!("creating {}", parent.display()), e))?;
    }
    make_private_dir(dir)?;
    let started = Instant::now();
    let saved = runsc(files)
        .args(["checkpoint", "--leave-running"])
        .args(super::runsc::CHECKPOINT_FLAGS)
        .arg(format!("--image-path={}", dir.display()))
        .arg(id)
        .output()
        .map_err(|e| RuntimeError::sys_owned(format!("starting {}", files.runsc.display()), e))?;
    if !saved.status.success() {
        let said = String::from_utf8_lossy(&saved.stderr).trim().to_owned();
        return Err(RuntimeError::Runsc(format!("taking a memory snapshot of sandbox {id} failed: {said}")));
    }
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o600));
    }
    tracing::info!(sandbox = %id, ms = started.elapsed().as_millis() as u64, dir = %dir.display(), "memory snapshot taken");
    Ok(())
}

/// Starts the sandbox of `guard` (record, cgroup and bundle `host` exist) from the image in `dir`; returns the host
/// end of its channel once it runs. On error the caller drops the guard, which removes everything.
pub(super) fn start_from(
    config: &RuntimeConfig,
    guard: &mut SandboxGuard,
    host: &GvisorFiles,
    dir: &Path,
) -> Result<UnixStream, RuntimeError> {
    if !dir.join("checkpoint.img").is_file() {
        return Err(RuntimeError::InvalidInput(format!(
            "{} holds no memory snapshot (checkpoint.img is missing)",
            dir.display()
        )));
    }
    let restore = [
        "restore".into(),
        format!("--image-path={}", dir.display()).into(),
        "--bundle".into(),
        host.bundle.clone().into_os_string(),
    ];
    let channel = super::runsc::start(config, guard, host, &restore)?;
    wait_until_running(guard, host)?;
    super::oom::shield_runtime(guard);
    Ok(channel)
}
