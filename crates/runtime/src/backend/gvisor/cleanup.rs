//! Removing what a gVisor sandbox leaves on the host besides its cgroup: runsc's state (`runsc delete --force`), the
//! bundle directory and the checkpoint image of a paused sandbox. Used when a sandbox is released and by `gc` for the
//! leftovers of a crashed owner.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::config::RuntimeConfig;

/// The host files of one gVisor sandbox, removed when its guard is released (after its processes are dead), and
/// what starting runsc on them again (a restore) needs to know.
#[derive(Debug, Clone)]
pub(crate) struct GvisorFiles {
    /// The runsc binary.
    pub runsc: PathBuf,
    /// runsc's `--root`.
    pub runsc_root: PathBuf,
    /// The bundle directory.
    pub bundle: PathBuf,
    /// Where the sandbox's checkpoint image is while it is paused (`<state_dir>/checkpoints/ID`, mode 0700).
    pub checkpoint: PathBuf,
    /// The host paths the bundle binds read-only (made read-only in runsc's own mount namespace).
    pub read_only: Vec<PathBuf>,
    /// The bundle binds the egress door (runsc gets `--host-uds=open`).
    pub door: bool,
    /// The sandbox is checkpointed: no process of it runs, its memory is in `checkpoint`.
    pub checkpointed: bool,
    /// A built template's layers: overlay's options for the read-only overlay runsc's mount namespace gets at
    /// `bundle/template` (bound at `/opt` inside).
    pub template: Option<String>,
}

impl GvisorFiles {
    /// The files of sandbox `id` under `config`'s state directory (nothing is created).
    pub fn new(config: &RuntimeConfig, id: &str) -> GvisorFiles {
        GvisorFiles {
            runsc: config.gvisor.runsc.clone(),
            runsc_root: super::runsc_root(config),
            bundle: super::bundles_dir(config).join(id),
            checkpoint: super::checkpoint::images_dir(config).join(id),
            read_only: Vec::new(),
            door: false,
            checkpointed: false,
            template: None,
        }
    }

    /// Where runsc's mount namespace mounts the template's overlay (an empty directory of the bundle, also the
    /// overlay's bottom layer).
    pub fn template_mount_point(&self) -> PathBuf {
        self.bundle.join("template")
    }

    /// Deletes runsc's record of the container, the bundle and the checkpoint image. Idempotent.
    pub fn remove(&self, id: &str) -> std::io::Result<()> {
        delete_container(&self.runsc, &self.runsc_root, id);
        remove_dir(&self.checkpoint)?;
        remove_dir(&self.bundle)
    }
}

fn remove_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Removes runsc's state of container `id`, whose processes are all dead by now (they lived in the sandbox's cgroup,
/// which was killed first). runsc keeps three entries per container in its root, all named after the id
/// (`ID_sandbox:ID.state`, `ID_sandbox:ID.lock`, `runsc-ID.sock`); `runsc delete --force` would remove them too but
/// waits ~1.4 s for the dead sandbox to answer, so they are removed directly, and `delete` is the fallback for a
/// layout this code does not know.
pub(super) fn delete_container(runsc: &Path, root: &Path, id: &str) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    let mut unknown = false;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if sandbox_id_in(&name).as_deref() != Some(id) {
            continue;
        }
        let known = name == format!("{id}_sandbox:{id}.state")
            || name == format!("{id}_sandbox:{id}.lock")
            || name == format!("runsc-{id}.sock");
        if !known || std::fs::remove_file(entry.path()).is_err() {
            unknown = true;
        }
    }
    if !unknown {
        return;
    }
    let status = Command::new(runsc)
        .arg(format!("--root={}", root.display()))
        .args(["delete", "--force", id])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if let Err(error) = status {
        tracing::warn!(%error, sandbox = %id, "runsc delete failed");
    }
}

/// The ids that have a bundle, a checkpoint image or a runsc state entry now. Listed *before* the records (as the cgroups are): a sandbox's
/// record is written before its bundle exists, so a sandbox being created that has a bundle here has its record in a
/// later listing, and one created after this listing is not a candidate at all.
pub fn leftover_candidates(config: &RuntimeConfig) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    for dir in [super::bundles_dir(config), super::checkpoint::images_dir(config), super::runsc_root(config)] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                if let Some(id) = sandbox_id_in(&entry.file_name().to_string_lossy())
                    && !ids.contains(&id)
                {
                    ids.push(id);
                }
            }
        }
    }
    ids
}

/// Removes the bundles, checkpoint images and runsc state of the `candidates` (from `leftover_candidates`) that are not `live`
/// (recorded with a living owner). Returns the ids removed.
pub fn remove_leftovers(config: &RuntimeConfig, candidates: Vec<String>, live: &dyn Fn(&str) -> bool) -> Vec<String> {
    let mut removed = Vec::new();
    for id in candidates {
        if live(&id) {
            continue;
        }
        match GvisorFiles::new(config, &id).remove(&id) {
            Ok(()) => removed.push(id),
            Err(error) => tracing::warn!(%error, sandbox = %id, "removing a gVisor sandbox's leftovers failed"),
        }
    }
    removed
}

/// The sandbox id a bundle directory or runsc state entry is named after (`sb-…`): `ID`, `ID_sandbox:ID.state`,
/// `runsc-ID.sock`.
fn sandbox_id_in(name: &str) -> Option<String> {
    let name = name.strip_prefix("runsc-").unwrap_or(name);
    let stem = name.split(['_', '.', ':']).next()?;
    let looks_like_id =
        !stem.is_empty() && stem.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') && stem.contains('-');
    looks_like_id.then(|| stem.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runsc_state_entries_and_bundles_are_named_after_their_sandbox() {
        for name in [
            "sb-0123456789abcdef",
            "sb-0123456789abcdef_sandbox:sb-0123456789abcdef.state",
            "runsc-sb-0123456789abcdef.sock",
        ] {
            assert_eq!(sandbox_id_in(name).as_deref(), Some("sb-0123456789abcdef"), "{name}");
        }
        assert_eq!(sandbox_id_in("runsc.log"), None);
    }
}
