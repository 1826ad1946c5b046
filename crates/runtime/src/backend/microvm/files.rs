//! The host files of one microVM sandbox: its directory under the state directory (`microvm/ID`) holding its
//! writable disk, the guest's console log, the VMM's log and its monitor socket. Removed when the sandbox is released (after the VMM is
//! dead), and by `gc` for a crashed owner's sandboxes.

use std::path::{Path, PathBuf};

use crate::config::RuntimeConfig;

/// Where microVM sandboxes keep their directories.
pub(crate) fn sandboxes_dir(config: &RuntimeConfig) -> PathBuf {
    config.state_dir.join("microvm")
}

/// The directory of one microVM sandbox and the files in it, and what starts its VMM again after a pause that
/// released it.
#[derive(Debug, Clone)]
pub(crate) struct MicrovmFiles {
    pub(crate) dir: PathBuf,
    /// The spec and agent plan its VMM was started with (what a resume after a released pause starts it with).
    pub(crate) launch: Option<std::sync::Arc<(sandkasten_types::SandboxSpec, sandkasten_protocol::AgentPlan)>>,
    /// Paused with its VM released: its memory is in `paused()`, no VMM runs and its cgroup is gone.
    pub(crate) released: bool,
}

impl MicrovmFiles {
    /// The files of sandbox `id` (nothing is created).
    pub(crate) fn new(config: &RuntimeConfig, id: &str) -> MicrovmFiles {
        MicrovmFiles { dir: sandboxes_dir(config).join(id), launch: None, released: false }
    }

    pub(crate) fn disk(&self) -> PathBuf {
        self.dir.join("disk.ext4")
    }

    /// The guest's serial console: the kernel's messages and what the initramfs says when it fails.
    pub(crate) fn console(&self) -> PathBuf {
        self.dir.join("console.log")
    }

    /// QEMU's standard error.
    pub(crate) fn vmm_log(&self) -> PathBuf {
        self.dir.join("vmm.log")
    }

    /// What the VM is (`memory::SavedConfig`), written at its start, copied into its memory snapshots.
    pub(crate) fn config(&self) -> PathBuf {
        self.dir.join("vm.json")
    }

    /// The memory of a VM paused with `release_paused` (a directory: `memory`'s files, without the disk, which
    /// stays where it is).
    pub(crate) fn paused(&self) -> PathBuf {
        self.dir.join("paused")
    }

    /// The VMM's monitor socket (0600: only the spawner connects; `qmp`).
    pub(crate) fn monitor(&self) -> PathBuf {
        self.dir.join("qmp.sock")
    }

    /// Deletes the directory. Idempotent.
    pub(crate) fn remove(&self) -> std::io::Result<()> {
        match std::fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// Why a VM ended on its own, when its console says: a guest kernel panic (which is also how an agent that died
/// as the guest's PID 1 ends: "Attempted to kill init!"), by the kernel's panic line.
pub(crate) fn panic_line(console: &Path) -> Option<String> {
    let text = std::fs::read(console).ok()?;
    let text = String::from_utf8_lossy(&text[text.len().saturating_sub(16 * 1024)..]).into_owned();
    let line = text.lines().rev().find(|line| line.contains("Kernel panic - not syncing"))?;
    let line = line.trim_matches(|c: char| c.is_control() || c == ' ');
    let line = line.find("Kernel panic").map_or(line, |at| &line[at..]);
    Some(format!("the guest kernel panicked: {}", line.trim_end_matches(" ]---")))
}

/// The last lines of a log, joined, or `None` when it says nothing.
pub(crate) fn last_lines(path: &Path, count: usize) -> Option<String> {
    let text = std::fs::read(path).ok()?;
    let text = String::from_utf8_lossy(&text[text.len().saturating_sub(16 * 1024)..]).into_owned();
    let lines: Vec<&str> = text
        .lines()
        .map(|line| line.trim_matches(|c: char| c.is_control() || c == ' '))
        .filter(|l| !l.is_empty())
        .collect();
    let tail = lines[lines.len().saturating_sub(count)..].join("; ");
    (!tail.is_empty()).then_some(tail)
}

/// The sandboxes that have a directory now: listed before the records, so that a sandbox whose record is written
/// after the listing (and whose directory comes after its record) is never among them.
pub(crate) fn leftover_candidates(config: &RuntimeConfig) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(sandboxes_dir(config)) else { return Vec::new() };
    entries.flatten().map(|entry| entry.file_name().to_string_lossy().into_owned()).collect()
}

/// Removes the directories of the `candidates` that `is_live` does not claim (a crashed owner's sandboxes; their
/// VMMs died with their cgroups). Returns the ids removed.
pub(crate) fn remove_leftovers(
    config: &RuntimeConfig,
    candidates: Vec<String>,
    is_live: &dyn Fn(&str) -> bool,
) -> Vec<String> {
    candidates.into_iter().filter(|id| !is_live(id) && MicrovmFiles::new(config, id).remove().is_ok()).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_panicked_guest_is_told_by_its_panic_line_and_a_quiet_one_by_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let console = dir.path().join("console.log");
        assert_eq!(panic_line(&console), None, "no console");
        std::fs::write(&console, "[    1.2] EXT4-fs (vda): mounted\r\nsandkasten: serving\r\n").unwrap();
        assert_eq!(panic_line(&console), None, "a console without a panic");
        std::fs::write(
            &console,
            "[    9.1] Kernel panic - not syncing: Out of memory: system-wide panic_on_oom is enabled\r\n\
             [    9.2] CPU: 0 PID: 1 Comm: python3\r\n[    9.3]  </TASK>\r\n\
             [    9.4] ---[ end Kernel panic - not syncing: Out of memory: system-wide panic_on_oom is enabled ]---\r\n",
        )
        .unwrap();
        assert_eq!(
            panic_line(&console).as_deref(),
            Some(
                "the guest kernel panicked: Kernel panic - not syncing: Out of memory: system-wide panic_on_oom is enabled"
            )
        );
    }
}
