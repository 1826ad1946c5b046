//! Run-time choice of the host hierarchy from `/proc/self/mountinfo`: v2 when the unified hierarchy has
//! the needed controllers, else the v1 controller mounts, else a bare v2 mount.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use crate::error::CgroupError;
use crate::hierarchy::Hierarchy;
use crate::mountinfo::{self, CgroupMount};
use crate::{fsops, v1, v2};

/// The mount table of the calling process.
const MOUNTINFO: &str = "/proc/self/mountinfo";

impl Hierarchy {
    /// Detects the host hierarchy from `/proc/self/mountinfo`.
    pub fn detect() -> Result<Hierarchy, CgroupError> {
        let path = PathBuf::from(MOUNTINFO);
        let text =
            fs::read_to_string(&path).map_err(|source| CgroupError::ReadMountinfo { path: path.clone(), source })?;
        Hierarchy::from_mountinfo(&text).ok_or(CgroupError::NoHierarchy { path })
    }

    /// Chooses a hierarchy from a mountinfo text, reading the cgroup2 mount's `cgroup.controllers` from
    /// disk; `None` when there is no cgroup mount at all.
    pub fn from_mountinfo(text: &str) -> Option<Hierarchy> {
        choose(&mountinfo::parse(text), |root| fsops::read_words(&root.join("cgroup.controllers")).unwrap_or_default())
    }
}

/// The decision: the first cgroup2 mount if it offers all of memory, pids and cpu; else the v1 mounts
/// (first mount per controller wins) if any needed v1 controller is mounted; else the cgroup2 mount.
fn choose(mounts: &[CgroupMount], v2_controllers: impl Fn(&Path) -> BTreeSet<String>) -> Option<Hierarchy> {
    let unified = mounts.iter().find(|m| m.unified).map(|m| m.mount_point.clone());
    if let Some(root) = &unified {
        let have = v2_controllers(root);
        if v2::CONTROLLERS.iter().all(|c| have.contains(*c)) {
            return Some(Hierarchy::v2_at(root.clone()));
        }
    }
    let mut controllers = BTreeMap::new();
    for mount in mounts.iter().filter(|m| !m.unified) {
        for controller in &mount.controllers {
            controllers.entry(controller.clone()).or_insert_with(|| mount.mount_point.clone());
        }
    }
    if v1::CONTROLLERS.iter().any(|c| controllers.contains_key(*c)) {
        return Some(Hierarchy::v1_at(controllers));
    }
    unified.map(Hierarchy::v2_at)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::CgroupVersion;

    const HYBRID: &str = "\
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    fn words(list: &str) -> BTreeSet<String> {
        list.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn hybrid_host_with_an_empty_unified_mount_is_v1_with_co_mounted_cpu() {
        let chosen = choose(&mountinfo::parse(HYBRID), |_| words("hugetlb")).unwrap();
        let path = PathBuf::from;
        let expected = BTreeMap::from([
            ("cpu".to_owned(), path("/sys/fs/cgroup/cpu,cpuacct")),
            ("cpuacct".to_owned(), path("/sys/fs/cgroup/cpu,cpuacct")),
            ("memory".to_owned(), path("/sys/fs/cgroup/memory")),
            ("pids".to_owned(), path("/sys/fs/cgroup/pids")),
            ("freezer".to_owned(), path("/sys/fs/cgroup/freezer")),
        ]);
        assert_eq!(chosen, Hierarchy::v1_at(expected));
    }

    #[test]
    fn unified_mount_with_the_controllers_wins_over_v1() {
        let chosen = choose(&mountinfo::parse(HYBRID), |_| words("cpuset cpu io memory pids")).unwrap();
        assert_eq!(chosen, Hierarchy::v2_at(PathBuf::from("/sys/fs/cgroup/unified")));
    }

    #[test]
    fn bare_unified_mount_without_v1_is_still_v2() {
        let text = "41 31 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n";
        let chosen = choose(&mountinfo::parse(text), |_| BTreeSet::new()).unwrap();
        assert_eq!(chosen.version(), CgroupVersion::V2);
        assert!(choose(&[], |_| BTreeSet::new()).is_none());
    }

    #[test]
    fn controllers_are_read_from_the_cgroup2_mount_on_disk() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("cgroup.controllers"), "cpuset cpu io memory hugetlb pids rdma\n").unwrap();
        let text = format!("30 23 0:26 / {} rw - cgroup2 cgroup2 rw,nsdelegate\n", tmp.path().display());
        assert_eq!(Hierarchy::from_mountinfo(&text), Some(Hierarchy::v2_at(tmp.path().to_owned())));
    }

    #[test]
    fn this_host_is_detected() {
        // Whatever the host has, detection must not fail where /sys/fs/cgroup is mounted.
        if Path::new("/sys/fs/cgroup").is_dir() {
            let hierarchy = Hierarchy::detect().unwrap();
            eprintln!("{}", hierarchy.describe());
        }
    }
}
