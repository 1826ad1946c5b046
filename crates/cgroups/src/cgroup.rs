//! One created (or reopened) cgroup: its directories, and the operations on it that do not depend on
//! how it was made (add, list, kill, usage, remove).

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::error::CgroupError;
use crate::usage::{self, MemoryNow, Usage};
use crate::{CgroupVersion, fsops, v1, v2};

/// Where a cgroup lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Dirs {
    /// One directory per controller (co-mounted controllers share one).
    V1(BTreeMap<String, PathBuf>),
    /// The one directory in the unified hierarchy.
    V2(PathBuf),
}

/// A cgroup made by `Hierarchy::create` or found by `Hierarchy::open`. Dropping it leaves the cgroup in
/// place; call `remove` to kill its processes and delete it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    name: String,
    dirs: Dirs,
    missing: Vec<String>,
}

impl Cgroup {
    pub(crate) fn new(name: &str, dirs: Dirs, missing: Vec<String>) -> Cgroup {
        Cgroup { name: name.to_owned(), dirs, missing }
    }

    /// The cgroup's name (last path component).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The hierarchy version it lives in.
    pub fn version(&self) -> CgroupVersion {
        match self.dirs {
            Dirs::V1(_) => CgroupVersion::V1,
            Dirs::V2(_) => CgroupVersion::V2,
        }
    }

    /// Its distinct directories, sorted (v1: one per mount; v2: one).
    pub fn paths(&self) -> Vec<PathBuf> {
        match &self.dirs {
            Dirs::V1(dirs) => v1::unique_dirs(dirs),
            Dirs::V2(dir) => vec![dir.clone()],
        }
    }

    /// The directory holding `controller`'s files (v1: that controller's mount; v2: the one directory);
    /// `None` if a v1 cgroup does not have that controller.
    pub fn controller_path(&self, controller: &str) -> Option<PathBuf> {
        match &self.dirs {
            Dirs::V1(dirs) => dirs.get(controller).cloned(),
            Dirs::V2(dir) => Some(dir.clone()),
        }
    }

    /// The needed controllers it does not have (v1: memory, pids, cpu, cpuacct, freezer;
    /// v2: memory, pids, cpu), so `doctor` and logs can say what is not enforced.
    pub fn missing_controllers(&self) -> &[String] {
        &self.missing
    }

    /// Moves process `pid` into the cgroup (writes it to `cgroup.procs` in every directory).
    pub fn add_process(&self, pid: u32) -> Result<(), CgroupError> {
        let value = pid.to_string();
        for dir in self.paths() {
            fsops::write(&dir.join("cgroup.procs"), &value)?;
        }
        Ok(())
    }

    /// The pids inside (union of `cgroup.procs`), sorted.
    pub fn pids(&self) -> Result<Vec<u32>, CgroupError> {
        match &self.dirs {
            Dirs::V1(dirs) => v1::pids(dirs),
            Dirs::V2(dir) => fsops::read_procs(dir),
        }
    }

    /// Kills every process inside, including ones forked during the kill, and waits (about 2 s at most)
    /// until `cgroup.procs` is empty. v2: `cgroup.kill` (or freeze + SIGKILL + thaw); v1: freezer
    /// `FROZEN`, SIGKILL each, `THAWED`.
    pub fn kill_all(&self) -> Result<(), CgroupError> {
        match &self.dirs {
            Dirs::V1(dirs) => v1::kill_all(dirs),
            Dirs::V2(dir) => v2::kill_all(dir),
        }
    }

    /// Freezes every process inside (they get no CPU and keep their memory) and waits until the kernel says the
    /// cgroup is frozen; `thaw` undoes it. v1: the freezer controller (`NoFreezer` without it); v2: `cgroup.freeze`.
    pub fn freeze(&self) -> Result<(), CgroupError> {
        self.set_frozen(true)
    }

    /// Lets a frozen cgroup's processes run again.
    pub fn thaw(&self) -> Result<(), CgroupError> {
        self.set_frozen(false)
    }

    fn set_frozen(&self, frozen: bool) -> Result<(), CgroupError> {
        match &self.dirs {
            Dirs::V1(dirs) => match dirs.get("freezer").filter(|dir| dir.is_dir()) {
                Some(freezer) => v1::set_frozen(freezer, frozen),
                None => Err(CgroupError::NoFreezer { name: self.name.clone() }),
            },
            Dirs::V2(dir) => v2::set_frozen(dir, frozen),
        }
    }

    /// What the cgroup has consumed so far; missing accounting files count as 0.
    pub fn usage(&self) -> Result<Usage, CgroupError> {
        match &self.dirs {
            Dirs::V1(dirs) => usage::read_v1(dirs),
            Dirs::V2(dir) => usage::read_v2(dir),
        }
    }

    /// The memory the cgroup holds now (a missing memory controller counts as 0).
    pub fn memory_now(&self) -> Result<MemoryNow, CgroupError> {
        match &self.dirs {
            Dirs::V1(dirs) => usage::memory_now_v1(dirs),
            Dirs::V2(dir) => usage::memory_now_v2(dir),
        }
    }

    /// `kill_all`, then `rmdir` of every directory (retrying briefly while busy). Idempotent: directories
    /// that are already gone are fine. Never deletes recursively.
    pub fn remove(self) -> Result<(), CgroupError> {
        self.kill_all()?;
        for dir in self.paths() {
            fsops::remove_dir(&dir)?;
        }
        Ok(())
    }
}
