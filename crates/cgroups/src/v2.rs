//! cgroup v2: one directory in the unified hierarchy, controllers enabled through the ancestors'
//! `cgroup.subtree_control`, and killing through `cgroup.kill` (or `cgroup.freeze` on older kernels).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::cgroup::{Cgroup, Dirs};
use crate::error::CgroupError;
use crate::fsops;
use crate::kill::{self, FREEZE_WAIT, KILL_DEADLINE};
use crate::limits::CgroupLimits;

/// The controllers enabled for a sandbox cgroup.
pub(crate) const CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// Creates `<root>/<parent>/<name>`: enables the needed controllers from the root down to the parent
/// (best effort), checks the limits' controllers are there, `mkdir`s and applies `limits`; on failure
/// removes the directory again.
pub(crate) fn create(
    root: &Path,
    parent_rel: &Path,
    full_rel: &Path,
    name: &str,
    limits: &CgroupLimits,
) -> Result<Cgroup, CgroupError> {
    fsops::ensure_dirs(root, parent_rel)?;
    let mut ancestor = root.to_owned();
    let mut available = enable_controllers(&ancestor)?;
    for component in parent_rel.components() {
        ancestor.push(component);
        available = enable_controllers(&ancestor)?;
    }
    let missing: Vec<String> =
        CONTROLLERS.iter().filter(|c| !available.contains(**c)).map(|c| (*c).to_owned()).collect();
    let dir = root.join(full_rel);
    for controller in limits.needed_controllers() {
        if !available.contains(controller) {
            return Err(CgroupError::ControllerUnavailable { controller, path: dir });
        }
    }
    fsops::create_dir(&dir)?;
    if let Err(err) = apply_limits(&dir, limits) {
        // Best effort: the original error is the one worth reporting.
        let _ = fsops::remove_dir(&dir);
        return Err(err);
    }
    Ok(Cgroup::new(name, Dirs::V2(dir), missing))
}

/// Writes `+<controller>` to `<dir>/cgroup.subtree_control` for each needed controller that `dir` has
/// (`cgroup.controllers`) and has not enabled yet; returns the needed controllers now enabled, i.e. those
/// children of `dir` get. A refused write is not an error: that controller then stays unavailable.
fn enable_controllers(dir: &Path) -> Result<BTreeSet<&'static str>, CgroupError> {
    let have = fsops::read_words(&dir.join("cgroup.controllers"))?;
    let subtree_control = dir.join("cgroup.subtree_control");
    let already = fsops::read_words(&subtree_control)?;
    let mut enabled = BTreeSet::new();
    for controller in CONTROLLERS {
        // One controller per write, so one refusal does not block the others.
        if already.contains(controller)
            || (have.contains(controller) && fsops::write(&subtree_control, &format!("+{controller}")).is_ok())
        {
            enabled.insert(controller);
        }
    }
    Ok(enabled)
}

/// Writes `memory.max` (+ `memory.swap.max` = 0 when swap accounting exists), `pids.max`, and
/// `cpu.max` as `quota period`.
pub(crate) fn apply_limits(dir: &Path, limits: &CgroupLimits) -> Result<(), CgroupError> {
    if let Some(bytes) = limits.memory_bytes {
        fsops::write(&dir.join("memory.max"), &bytes.to_string())?;
        let swap = dir.join("memory.swap.max");
        if swap.exists() {
            fsops::write(&swap, "0")?;
        }
    }
    if let Some(max) = limits.pids_max {
        fsops::write(&dir.join("pids.max"), &max.to_string())?;
    }
    if let Some(quota) = limits.cpu_quota_us {
        fsops::write(&dir.join("cpu.max"), &format!("{quota} {}", limits.cpu_period_us))?;
    }
    Ok(())
}

/// The cgroup `<root>/<parent>/<name>` if its directory exists.
pub(crate) fn open(root: &Path, full_rel: &Path, name: &str) -> Result<Option<Cgroup>, CgroupError> {
    let dir = root.join(full_rel);
    if !dir.is_dir() {
        return Ok(None);
    }
    let have = fsops::read_words(&dir.join("cgroup.controllers"))?;
    let missing = CONTROLLERS.iter().filter(|c| !have.contains(**c)).map(|c| (*c).to_owned()).collect();
    Ok(Some(Cgroup::new(name, Dirs::V2(dir), missing)))
}

/// Kills everything in `dir` and waits for `cgroup.procs` to empty: one write to `cgroup.kill` where the
/// kernel has it (5.14+), else freeze, SIGKILL each, thaw, repeated until empty or the deadline passes.
pub(crate) fn kill_all(dir: &Path) -> Result<(), CgroupError> {
    let deadline = Instant::now() + KILL_DEADLINE;
    let kill_file = dir.join("cgroup.kill");
    let procs_empty = || Ok(fsops::read_procs(dir)?.is_empty());
    if !dir.is_dir() || procs_empty()? {
        return Ok(());
    }
    if kill_file.exists() {
        fsops::write(&kill_file, "1")?;
        if kill::poll_until(deadline, procs_empty)? {
            return Ok(());
        }
        return Err(timeout(dir));
    }
    loop {
        freeze(dir, deadline.min(Instant::now() + FREEZE_WAIT))?;
        let killed = kill::kill_listed(deadline, || fsops::read_procs(dir));
        // Thaw even when killing failed: a frozen cgroup must not be left behind.
        fsops::write(&dir.join("cgroup.freeze"), "0")?;
        killed?;
        if kill::poll_until(deadline.min(Instant::now() + FREEZE_WAIT), procs_empty)? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(timeout(dir));
        }
    }
}

/// Writes `1` to `cgroup.freeze` and waits (until `until`) for `cgroup.events` to say `frozen 1`.
fn freeze(dir: &Path, until: Instant) -> Result<(), CgroupError> {
    fsops::write(&dir.join("cgroup.freeze"), "1")?;
    let events = dir.join("cgroup.events");
    kill::poll_until(until, || {
        Ok(fsops::read_optional(&events)?.is_some_and(|text| text.lines().any(|l| l.trim() == "frozen 1")))
    })?;
    Ok(())
}

/// The `KillTimeout` error for `dir`, listing what is still inside.
fn timeout(dir: &Path) -> CgroupError {
    let pids = fsops::read_procs(dir).unwrap_or_default();
    CgroupError::KillTimeout { path: PathBuf::from(dir), pids }
}

/// Freezes (`cgroup.freeze` 1) or thaws (0) the cgroup and waits (`KILL_DEADLINE`) for `cgroup.events` to agree.
pub(crate) fn set_frozen(dir: &Path, frozen: bool) -> Result<(), CgroupError> {
    let wanted = if frozen { "frozen 1" } else { "frozen 0" };
    fsops::write(&dir.join("cgroup.freeze"), if frozen { "1" } else { "0" })?;
    let events = dir.join("cgroup.events");
    let reached = kill::poll_until(Instant::now() + KILL_DEADLINE, || {
        Ok(fsops::read_optional(&events)?.is_some_and(|text| text.lines().any(|l| l.trim() == wanted)))
    })?;
    if reached {
        Ok(())
    } else {
        Err(CgroupError::FreezeTimeout { path: events, wanted: if frozen { "frozen" } else { "thawed" } })
    }
}

#[cfg(test)]
mod tests;
