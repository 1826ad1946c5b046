//! cgroup v1: one directory per controller mount (co-mounted controllers share one), limits in the
//! v1 file names, and killing through the freezer controller.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::cgroup::{Cgroup, Dirs};
use crate::error::CgroupError;
use crate::fsops;
use crate::kill::{self, FREEZE_WAIT, KILL_DEADLINE};
use crate::limits::CgroupLimits;

/// The controllers a sandbox cgroup is created in.
pub(crate) const CONTROLLERS: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];

/// Splits the needed controllers into the mounted ones (controller → mount) and the missing ones.
fn split_needed(mounts: &BTreeMap<String, PathBuf>) -> (BTreeMap<String, PathBuf>, Vec<String>) {
    let mut present = BTreeMap::new();
    let mut missing = Vec::new();
    for controller in CONTROLLERS {
        match mounts.get(controller) {
            Some(mount) => {
                present.insert(controller.to_owned(), mount.clone());
            }
            None => missing.push(controller.to_owned()),
        }
    }
    (present, missing)
}

/// The distinct directories of a controller → directory map (co-mounted controllers share one).
pub(crate) fn unique_dirs(dirs: &BTreeMap<String, PathBuf>) -> Vec<PathBuf> {
    dirs.values().cloned().collect::<BTreeSet<_>>().into_iter().collect()
}

/// Creates `<mount>/<parent>/<name>` in every needed controller and applies `limits`; on failure removes
/// the directories it created.
pub(crate) fn create(
    mounts: &BTreeMap<String, PathBuf>,
    parent_rel: &Path,
    full_rel: &Path,
    name: &str,
    limits: &CgroupLimits,
) -> Result<Cgroup, CgroupError> {
    let (present, missing) = split_needed(mounts);
    if present.is_empty() {
        return Err(CgroupError::NoControllers);
    }
    for controller in limits.needed_controllers() {
        if !present.contains_key(controller) {
            return Err(CgroupError::ControllerUnavailable { controller, path: parent_rel.to_owned() });
        }
    }
    let dirs: BTreeMap<String, PathBuf> =
        present.iter().map(|(controller, mount)| (controller.clone(), mount.join(full_rel))).collect();
    let mut created = Vec::new();
    let built = make_dirs(&present, parent_rel, full_rel, &mut created).and_then(|()| apply_limits(&dirs, limits));
    if let Err(err) = built {
        for dir in created.iter().rev() {
            // Best effort: the original error is the one worth reporting.
            let _ = fsops::remove_dir(dir);
        }
        return Err(err);
    }
    Ok(Cgroup::new(name, Dirs::V1(dirs), missing))
}

/// `mkdir` of the parent (if missing) and the cgroup in each distinct mount; records what it created.
fn make_dirs(
    present: &BTreeMap<String, PathBuf>,
    parent_rel: &Path,
    full_rel: &Path,
    created: &mut Vec<PathBuf>,
) -> Result<(), CgroupError> {
    for mount in unique_dirs(present) {
        fsops::ensure_dirs(&mount, parent_rel)?;
        let dir = mount.join(full_rel);
        fsops::create_dir(&dir)?;
        created.push(dir);
    }
    Ok(())
}

/// Writes the v1 limit files: `memory.limit_in_bytes` (+ `memory.memsw.limit_in_bytes` when swap accounting
/// exists, so swap is 0, and `memory.kmem.tcp.limit_in_bytes` of the same size, so socket buffers are bounded too),
/// `pids.max`, `cpu.cfs_period_us` then `cpu.cfs_quota_us`.
pub(crate) fn apply_limits(dirs: &BTreeMap<String, PathBuf>, limits: &CgroupLimits) -> Result<(), CgroupError> {
    let dir = |controller: &'static str| {
        dirs.get(controller).ok_or_else(|| CgroupError::ControllerUnavailable { controller, path: PathBuf::new() })
    };
    if let Some(bytes) = limits.memory_bytes {
        let memory = dir("memory")?;
        let value = bytes.to_string();
        // memory.limit_in_bytes first: memsw may never be below it.
        fsops::write(&memory.join("memory.limit_in_bytes"), &value)?;
        let memsw = memory.join("memory.memsw.limit_in_bytes");
        if memsw.exists() {
            fsops::write(&memsw, &value)?;
        }
        // TCP socket buffers are not charged to memory.limit_in_bytes on v1: they get a limit of their own (the
        // same size), set before the sandbox has any socket. v2 charges them to memory.max.
        let tcp = memory.join("memory.kmem.tcp.limit_in_bytes");
        if tcp.exists() {
            fsops::write(&tcp, &value)?;
        }
    }
    if let Some(max) = limits.pids_max {
        fsops::write(&dir("pids")?.join("pids.max"), &max.to_string())?;
    }
    if let Some(quota) = limits.cpu_quota_us {
        let cpu = dir("cpu")?;
        fsops::write(&cpu.join("cpu.cfs_period_us"), &limits.cpu_period_us.to_string())?;
        fsops::write(&cpu.join("cpu.cfs_quota_us"), &quota.to_string())?;
    }
    Ok(())
}

/// The cgroup `<mount>/<parent>/<name>` in every needed controller that has it; `None` if none has it.
pub(crate) fn open(mounts: &BTreeMap<String, PathBuf>, full_rel: &Path, name: &str) -> Option<Cgroup> {
    let (present, mut missing) = split_needed(mounts);
    let mut dirs = BTreeMap::new();
    for (controller, mount) in present {
        let dir = mount.join(full_rel);
        if dir.is_dir() {
            dirs.insert(controller, dir);
        } else {
            missing.push(controller);
        }
    }
    missing.sort();
    (!dirs.is_empty()).then(|| Cgroup::new(name, Dirs::V1(dirs), missing))
}

/// Names of the cgroups under `<mount>/<parent>` in any needed controller.
pub(crate) fn list(mounts: &BTreeMap<String, PathBuf>, parent_rel: &Path) -> Result<BTreeSet<String>, CgroupError> {
    let (present, _) = split_needed(mounts);
    let mut names = BTreeSet::new();
    for mount in unique_dirs(&present) {
        names.extend(fsops::subdirs(&mount.join(parent_rel))?);
    }
    Ok(names)
}

/// The union of `cgroup.procs` over the controller directories.
pub(crate) fn pids(dirs: &BTreeMap<String, PathBuf>) -> Result<Vec<u32>, CgroupError> {
    let mut all = BTreeSet::new();
    for dir in unique_dirs(dirs) {
        all.extend(fsops::read_procs(&dir)?);
    }
    Ok(all.into_iter().collect())
}

/// Freeze (so nothing forks), SIGKILL every listed pid, thaw (so the kills take effect), wait for
/// `cgroup.procs` to empty; repeated until empty or the deadline passes. Without a freezer: kill until empty.
pub(crate) fn kill_all(dirs: &BTreeMap<String, PathBuf>) -> Result<(), CgroupError> {
    let deadline = Instant::now() + KILL_DEADLINE;
    let freezer = dirs.get("freezer").filter(|dir| dir.is_dir());
    loop {
        if pids(dirs)?.is_empty() {
            return Ok(());
        }
        if let Some(freezer) = freezer {
            freeze(freezer, deadline.min(Instant::now() + FREEZE_WAIT))?;
        }
        let killed = kill::kill_listed(deadline, || pids(dirs));
        if let Some(freezer) = freezer {
            // Thaw even when killing failed: a frozen cgroup must not be left behind.
            fsops::write(&freezer.join("freezer.state"), "THAWED")?;
        }
        killed?;
        let round = deadline.min(Instant::now() + FREEZE_WAIT);
        if kill::poll_until(round, || Ok(pids(dirs)?.is_empty()))? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let path = unique_dirs(dirs).into_iter().next().unwrap_or_default();
            return Err(CgroupError::KillTimeout { path, pids: pids(dirs)? });
        }
    }
}

/// Writes `FROZEN` and waits (until `until`) for the state to read `FROZEN`. Not reaching it is not an
/// error: the kill goes ahead and the outer loop repeats.
fn freeze(freezer: &Path, until: Instant) -> Result<(), CgroupError> {
    let state = freezer.join("freezer.state");
    fsops::write(&state, "FROZEN")?;
    kill::poll_until(until, || Ok(fsops::read(&state)?.trim() == "FROZEN"))?;
    Ok(())
}

/// Freezes (`FROZEN`) or thaws (`THAWED`) the cgroup and waits (`KILL_DEADLINE`) for the state to read so.
pub(crate) fn set_frozen(freezer: &Path, frozen: bool) -> Result<(), CgroupError> {
    let state = freezer.join("freezer.state");
    let wanted = if frozen { "FROZEN" } else { "THAWED" };
    fsops::write(&state, wanted)?;
    let reached = kill::poll_until(Instant::now() + KILL_DEADLINE, || Ok(fsops::read(&state)?.trim() == wanted))?;
    if reached {
        Ok(())
    } else {
        Err(CgroupError::FreezeTimeout { path: state, wanted: if frozen { "frozen" } else { "thawed" } })
    }
}

#[cfg(test)]
mod tests;
