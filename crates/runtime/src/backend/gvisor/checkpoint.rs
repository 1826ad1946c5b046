//! Pausing a gVisor sandbox by checkpoint, so that a paused sandbox holds nothing but files: `runsc checkpoint` saves
//! the whole sandbox (the Sentry's memory: every process, the tmpfs mounts, open files, the agent with its state)
//! into `<state_dir>/checkpoints/ID` (mode 0700, root's) and stops it; runsc, the Sentry and the gofer exit, and the
//! sandbox's cgroup is removed. Resuming creates the cgroup again with the same limits and starts `runsc restore`
//! of that image from the same bundle, started like `runsc run` (`runsc::start`: in the cgroup, in a mount namespace
//! with the bound host paths read-only) with a new socketpair as the container's stdin: runsc hands the new
//! descriptor to the restored init in place of the one it had, so the agent serves on the new channel. The image is
//! removed once the sandbox runs again, and with the sandbox (`GvisorFiles::remove`, and `gc` after a crash).

#![allow(unsafe_code)]

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{GvisorFiles, last_words};
use crate::backend::process::launch::Launcher;
use crate::config::RuntimeConfig;
use crate::error::RuntimeError;
use crate::guard::SandboxGuard;

/// Where paused gVisor sandboxes keep their checkpoint images, one directory per sandbox.
pub(crate) fn images_dir(config: &RuntimeConfig) -> PathBuf {
    config.state_dir.join("checkpoints")
}

/// How long runsc may take to stop after its sandbox was saved.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a restore may take until the sandbox runs again.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(30);

/// The files of a gVisor sandbox, or why there are none.
fn files_of(guard: &SandboxGuard) -> Result<GvisorFiles, RuntimeError> {
    guard
        .gvisor
        .clone()
        .ok_or_else(|| RuntimeError::InvalidInput(format!("sandbox {} is not a gVisor sandbox", guard.id)))
}

/// Saves the running sandbox of `guard` into its image directory and stops it; on success nothing of it runs and its
/// cgroup is gone. When runsc fails and the sandbox still runs, it runs on as before (the error says so); when it
/// died, its runsc has exited and the owner learns it from the exit like any other.
pub(super) fn checkpoint(config: &RuntimeConfig, guard: &mut SandboxGuard) -> Result<(), RuntimeError> {
    let files = files_of(guard)?;
    let id = guard.id.clone();
    let Some(pid) = guard.init_pid.filter(|_| !files.checkpointed) else {
        return Err(RuntimeError::InvalidInput(format!("sandbox {id} is not running (paused already?)")));
    };
    make_private_dir(&images_dir(config))?;
    remove_image(&files.checkpoint)?;
    make_private_dir(&files.checkpoint)?;
    let started = Instant::now();
    let saved = runsc(&files)
        .arg("checkpoint")
        .args(super::runsc::CHECKPOINT_FLAGS)
        .arg(format!("--image-path={}", files.checkpoint.display()))
        .arg(&id)
        .output();
    let said = match saved {
        Ok(output) if output.status.success() => None,
        Ok(output) => Some(String::from_utf8_lossy(&output.stderr).trim().to_owned()),
        Err(error) => Some(format!("could not start runsc: {error}")),
    };
    let saved_ms = started.elapsed().as_millis() as u64;
    if let Some(said) = said {
        let _ = remove_image(&files.checkpoint);
        return Err(RuntimeError::Runsc(format!("checkpointing sandbox {id} failed ({said}); it was not paused")));
    }
    // runsc stops the container once it is saved: `runsc run` exits (and is reaped here, so that the owner does not
    // take its exit for the sandbox's end).
    if wait_for_exit(pid, STOP_TIMEOUT) {
        guard.init_pid = None;
    } else {
        tracing::warn!(sandbox = %id, "runsc did not stop after its checkpoint; killing it");
    }
    // Whatever is left in the cgroup (nothing, normally).
    guard.kill();
    guard.reap();
    for entry in std::fs::read_dir(&files.checkpoint).into_iter().flatten().flatten() {
        let _ = std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o600));
    }
    super::cleanup::delete_container(&files.runsc, &files.runsc_root, &id);
    if let Some(gvisor) = &mut guard.gvisor {
        gvisor.checkpointed = true;
    }
    // The sandbox's usage so far outlives its cgroup. A cgroup that cannot be removed now stays the guard's (empty),
    // used again by the restore, removed with the sandbox (or by `gc`).
    let so_far = guard.usage();
    if let Some(cgroup) = guard.cgroup.clone() {
        match cgroup.remove() {
            Ok(()) => {
                guard.cgroup = None;
                guard.earlier_usage = so_far;
            }
            Err(error) => tracing::warn!(%error, sandbox = %id, "removing a checkpointed sandbox's cgroup failed"),
        }
    }
    let bytes: u64 = std::fs::read_dir(&files.checkpoint)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.metadata().ok())
        .map(|metadata| metadata.len())
        .sum();
    let ms = started.elapsed().as_millis() as u64;
    tracing::info!(sandbox = %id, saved_ms, ms, bytes, "gVisor sandbox checkpointed");
    Ok(())
}

/// Starts the checkpointed sandbox of `guard` again from its image, in a new cgroup with its limits, and returns
/// the host end of its new channel once it runs. On error its runsc may still be starting: the caller destroys the
/// sandbox (a sandbox that did not come back is gone, never half-alive).
pub(super) fn restore(
    config: &RuntimeConfig,
    cgroups: &Launcher<'_>,
    guard: &mut SandboxGuard,
) -> Result<UnixStream, RuntimeError> {
    let files = files_of(guard)?;
    let id = guard.id.clone();
    if !files.checkpointed {
        return Err(RuntimeError::InvalidInput(format!("sandbox {id} is not paused")));
    }
    let started = Instant::now();
    if guard.cgroup.is_none() {
        cgroups.recreate_cgroup(guard)?;
    }
    let restore = [
        "restore".into(),
        format!("--image-path={}", files.checkpoint.display()).into(),
        "--bundle".into(),
        files.bundle.clone().into_os_string(),
    ];
    let cgroup_ms = started.elapsed().as_millis() as u64;
    let channel = super::runsc::start(config, guard, &files, &restore)?;
    wait_until_running(guard, &files)?;
    super::oom::shield_runtime(guard);
    let running_ms = started.elapsed().as_millis() as u64;
    if let Some(gvisor) = &mut guard.gvisor {
        gvisor.checkpointed = false;
    }
    // The sandbox's memory is the Sentry's again: its copy on disk goes now.
    if let Err(error) = remove_image(&files.checkpoint) {
        tracing::warn!(%error, sandbox = %id, "removing a restored sandbox's checkpoint image failed");
    }
    let ms = started.elapsed().as_millis() as u64;
    tracing::info!(sandbox = %id, cgroup_ms, running_ms, ms, "gVisor sandbox restored");
    Ok(channel)
}

/// `runsc --root=…` with nothing of the owner's environment.
pub(super) fn runsc(files: &GvisorFiles) -> Command {
    let mut command = Command::new(&files.runsc);
    command
        .arg(format!("--root={}", files.runsc_root.display()))
        .env_clear()
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// How often a restore's progress is looked at: runsc's state file is a cheap read; `runsc state` (the fallback
/// when runsc keeps its state elsewhere) starts a Go program of ~20 ms of CPU, so it is asked far less often.
const STATE_FILE_POLL: Duration = Duration::from_millis(5);
const RUNSC_STATE_POLL: Duration = Duration::from_millis(100);

/// Waits until runsc says the restored container runs, or fails with what runsc said when it exited (or timed out).
/// The status is read from runsc's own state file (`<root>/<id>_sandbox:<id>.state`, the JSON `runsc state` reads)
/// every few ms; `runsc state` itself only when that file cannot be read.
pub(super) fn wait_until_running(guard: &mut SandboxGuard, files: &GvisorFiles) -> Result<(), RuntimeError> {
    let id = guard.id.clone();
    let log = files.bundle.join("runsc.log");
    let state_file = files.runsc_root.join(format!("{id}_sandbox:{id}.state"));
    let deadline = Instant::now() + RESTORE_TIMEOUT;
    let mut asked_runsc: Option<Instant> = None;
    loop {
        if let Some(pid) = guard.init_pid
            && exited(pid)
        {
            guard.init_pid = None;
            return Err(RuntimeError::Runsc(format!(
                "restoring sandbox {id} from its checkpoint failed: {}; the sandbox is gone",
                last_words(&log)
            )));
        }
        let status = match std::fs::read(&state_file) {
            Ok(bytes) => status_of(&bytes),
            Err(_) if asked_runsc.is_none_or(|at| at.elapsed() >= RUNSC_STATE_POLL) => {
                asked_runsc = Some(Instant::now());
                runsc(files)
                    .arg("state")
                    .arg(&id)
                    .output()
                    .ok()
                    .filter(|output| output.status.success())
                    .and_then(|output| status_of(&output.stdout))
            }
            Err(_) => None,
        };
        if status.as_deref() == Some("running") {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(RuntimeError::Runsc(format!(
                "sandbox {id} did not run within {RESTORE_TIMEOUT:?} of its restore ({}); the sandbox is gone",
                last_words(&log)
            )));
        }
        std::thread::sleep(STATE_FILE_POLL);
    }
}

/// The `status` of `runsc state`'s JSON (and of runsc's state file: `None` while it is half written).
fn status_of(state: &[u8]) -> Option<String> {
    let json: serde_json::Value = serde_json::from_slice(state).ok()?;
    json.get("status")?.as_str().map(str::to_owned)
}

/// Reaps `pid` if it has exited; true then.
fn exited(pid: u32) -> bool {
    let mut status = 0;
    // SAFETY: waitpid on our own child (not reaped yet), non-blocking, writing into an owned integer.
    unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) == pid as libc::pid_t }
}

/// Waits up to `timeout` for our child `pid` to exit; true when it did (it is reaped then).
fn wait_for_exit(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if exited(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

/// Creates `dir` with mode 0700 if it does not exist, and makes sure it has that mode if it does.
pub(super) fn make_private_dir(dir: &Path) -> Result<(), RuntimeError> {
    let io = |e| RuntimeError::sys_owned(format!("creating {}", dir.display()), e);
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(io(e)),
        _ => {}
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io)
}

fn remove_image(dir: &Path) -> Result<(), RuntimeError> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(RuntimeError::sys_owned(format!("removing {}", dir.display()), e))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_is_read_from_runsc_state() {
        let state = br#"{"ociVersion":"1.0.2-dev","id":"sb-1","status":"running","pid":7,"bundle":"/b"}"#;
        assert_eq!(status_of(state).as_deref(), Some("running"));
        assert_eq!(status_of(b"loading container: file does not exist"), None);
        assert_eq!(status_of(br#"{"id":"sb-1","spec":{"ociVersion""#), None, "a state file being written");
    }

    #[test]
    fn image_directories_are_private() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let images = dir.path().join("checkpoints");
        std::fs::create_dir(&images).unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(&images, std::fs::Permissions::from_mode(0o755)).unwrap_or_else(|e| panic!("{e}"));
        make_private_dir(&images).unwrap_or_else(|e| panic!("{e}"));
        make_private_dir(&images.join("sb-1")).unwrap_or_else(|e| panic!("{e}"));
        for path in [images.clone(), images.join("sb-1")] {
            let mode = std::fs::metadata(&path).map(|m| m.permissions().mode() & 0o777).unwrap_or_default();
            assert_eq!(mode, 0o700, "{}", path.display());
        }
    }
}
