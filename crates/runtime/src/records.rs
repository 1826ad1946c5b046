//! Durable sandbox records: one JSON file per sandbox in the state directory, written *before* any host resource of
//! the sandbox is created and removed *after* the last one is gone. A record whose owner process is dead describes
//! leftovers of a crash, which `gc` removes.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::RuntimeError;

/// What a sandbox holds on the host, and who owns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRecord {
    /// Sandbox id (also the record's file name and the cgroup's name).
    pub id: String,
    /// Isolation tier.
    pub tier: String,
    /// Host pid of the process that owns the sandbox (the CLI or the server).
    pub owner_pid: u32,
    /// The owner's start time in clock ticks since boot (`/proc/<pid>/stat` field 22), to tell a live owner from a
    /// recycled pid.
    pub owner_start_ticks: u64,
    /// The cgroup parent the sandbox's cgroup lives under (its name is the id).
    pub cgroup_parent: String,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// First host uid/gid of the sandbox's own id range (process tier; see `id_ranges`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_base: Option<u32>,
    /// The template layer directories the sandbox's root reads: while the record exists, `template rm` and
    /// `template gc` keep them (see [`layers_in_use`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<PathBuf>,
}

/// Start time of a live process in clock ticks since boot, or `None` when it does not exist or has exited (a zombie
/// waiting for a parent that may never reap it counts as gone: it holds nothing any more).
pub fn process_start_ticks(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: fields after it start after the last ')'.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    if matches!(fields.next(), Some("Z" | "X" | "x")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

impl SandboxRecord {
    /// A record owned by the calling process.
    pub fn owned_by_me(id: &str, tier: &str, cgroup_parent: &str) -> SandboxRecord {
        let owner_pid = std::process::id();
        SandboxRecord {
            id: id.to_owned(),
            tier: tier.to_owned(),
            owner_pid,
            owner_start_ticks: process_start_ticks(owner_pid).unwrap_or(0),
            cgroup_parent: cgroup_parent.to_owned(),
            created_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            id_base: None,
            layers: Vec::new(),
        }
    }

    /// True while the owning process is the same one that wrote the record.
    pub fn owner_alive(&self) -> bool {
        process_start_ticks(self.owner_pid) == Some(self.owner_start_ticks)
    }
}

/// The template layer directories that the sandboxes recorded in `dir` read (every record counts, its owner alive or
/// not: a crashed owner's sandbox keeps its layers until `sandkasten gc` removes its record). Unreadable records are
/// skipped; a missing directory means none.
pub fn layers_in_use(dir: &Path) -> std::collections::HashSet<PathBuf> {
    let store = RecordStore::new(dir.to_path_buf());
    store.list().unwrap_or_default().into_iter().flatten().flat_map(|record| record.layers).collect()
}

/// The record store: a directory of `<id>.json` files.
#[derive(Debug, Clone)]
pub struct RecordStore {
    dir: PathBuf,
}

impl RecordStore {
    /// A store in `dir` (created on first write).
    pub fn new(dir: PathBuf) -> Self {
        RecordStore { dir }
    }

    fn path_of(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    fn error(path: &Path, source: io::Error) -> RuntimeError {
        RuntimeError::Record { path: path.to_path_buf(), source }
    }

    /// Writes a record atomically: to a temporary file, then renamed into place.
    ///
    /// No fsync: a record must survive the crash of its owner, which the page cache guarantees; what it describes
    /// (cgroups, processes) does not survive a reboot, and after one `gc` drops records whose cgroups are gone. On
    /// hosts where `/run` is a disk filesystem an fsync would cost milliseconds per sandbox for nothing.
    pub fn write(&self, record: &SandboxRecord) -> Result<(), RuntimeError> {
        fs::create_dir_all(&self.dir).map_err(|e| Self::error(&self.dir, e))?;
        let path = self.path_of(&record.id);
        let temporary = self.dir.join(format!(".{}.tmp", record.id));
        let json = serde_json::to_vec(record).map_err(|e| Self::error(&path, e.into()))?;
        let mut file = fs::File::create(&temporary).map_err(|e| Self::error(&temporary, e))?;
        file.write_all(&json).map_err(|e| Self::error(&temporary, e))?;
        fs::rename(&temporary, &path).map_err(|e| Self::error(&path, e))
    }

    /// Removes a record; a missing one is fine.
    pub fn remove(&self, id: &str) -> Result<(), RuntimeError> {
        let path = self.path_of(id);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(Self::error(&path, e)),
            _ => Ok(()),
        }
    }

    /// Every readable record; unreadable or foreign files are returned by name as `Err` so gc can report them.
    pub fn list(&self) -> Result<Vec<Result<SandboxRecord, PathBuf>>, RuntimeError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Self::error(&self.dir, e)),
        };
        let mut records = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|ext| ext != "json") {
                continue;
            }
            let parsed = fs::read(&path).ok().and_then(|bytes| serde_json::from_slice(&bytes).ok());
            records.push(parsed.ok_or(path));
        }
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_removal_is_idempotent() {
        let dir = tempfile::tempdir().map(|d| d.keep()).unwrap_or_default();
        let store = RecordStore::new(dir.join("sandboxes"));
        let record = SandboxRecord::owned_by_me("sb-1", "process", "sandkasten");
        assert!(store.write(&record).is_ok());
        let listed = store.list().unwrap_or_default();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].as_ref().ok(), Some(&record));
        assert!(record.owner_alive());
        assert!(store.remove("sb-1").is_ok());
        assert!(store.remove("sb-1").is_ok());
        assert!(store.list().unwrap_or_default().is_empty());
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn a_dead_or_recycled_owner_is_not_alive() {
        let mut record = SandboxRecord::owned_by_me("sb-2", "process", "sandkasten");
        record.owner_start_ticks += 1;
        assert!(!record.owner_alive());
        record.owner_pid = u32::MAX;
        assert!(!record.owner_alive());
    }
}
