//! Unit tests of the v1 file logic on a fake controller tree (`cpu,cpuacct` co-mounted).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

use super::*;
use crate::{CgroupVersion, Hierarchy};

/// A fake v1 tree: memory, pids, freezer, and cpu + cpuacct co-mounted, like many v1 hosts.
fn fake_tree() -> (TempDir, BTreeMap<String, PathBuf>) {
    let tmp = tempfile::tempdir().unwrap();
    let mut mounts = BTreeMap::new();
    for (controller, dir) in [
        ("memory", "memory"),
        ("pids", "pids"),
        ("cpu", "cpu,cpuacct"),
        ("cpuacct", "cpu,cpuacct"),
        ("freezer", "freezer"),
    ] {
        let path = tmp.path().join(dir);
        fs::create_dir_all(&path).unwrap();
        mounts.insert(controller.to_owned(), path);
    }
    (tmp, mounts)
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap().trim().to_owned()
}

/// Removes the regular files a test wrote, so `rmdir` can work as on cgroupfs.
fn clear_files(dir: &Path) {
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            fs::remove_file(entry.path()).unwrap();
        }
    }
}

fn all_limits() -> CgroupLimits {
    CgroupLimits { memory_bytes: Some(64 << 20), pids_max: Some(5), cpu_quota_us: Some(50_000), cpu_period_us: 100_000 }
}

#[test]
fn create_writes_each_limit_in_its_controller() {
    let (tmp, mounts) = fake_tree();
    let cgroup = Hierarchy::v1_at(mounts).create("sk", "run1", &all_limits()).unwrap();
    assert_eq!(cgroup.version(), CgroupVersion::V1);
    assert_eq!(cgroup.name(), "run1");
    assert!(cgroup.missing_controllers().is_empty());
    let root = tmp.path();
    assert_eq!(
        cgroup.paths(),
        ["cpu,cpuacct", "freezer", "memory", "pids"].map(|d| root.join(d).join("sk/run1")).to_vec()
    );
    assert_eq!(read(&root.join("memory/sk/run1/memory.limit_in_bytes")), "67108864");
    assert_eq!(read(&root.join("pids/sk/run1/pids.max")), "5");
    assert_eq!(read(&root.join("cpu,cpuacct/sk/run1/cpu.cfs_period_us")), "100000");
    assert_eq!(read(&root.join("cpu,cpuacct/sk/run1/cpu.cfs_quota_us")), "50000");
    // No swap accounting file in the fake child: nothing written there.
    assert!(!root.join("memory/sk/run1/memory.memsw.limit_in_bytes").exists());
}

#[test]
fn swap_is_limited_to_the_memory_limit_when_memsw_exists() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_owned();
    fs::write(dir.join("memory.memsw.limit_in_bytes"), "9223372036854771712").unwrap();
    let dirs = BTreeMap::from([("memory".to_owned(), dir.clone())]);
    apply_limits(&dirs, &CgroupLimits { memory_bytes: Some(1 << 20), ..CgroupLimits::default() }).unwrap();
    assert_eq!(read(&dir.join("memory.limit_in_bytes")), "1048576");
    assert_eq!(read(&dir.join("memory.memsw.limit_in_bytes")), "1048576");
}

#[test]
fn unlimited_writes_no_limit_files() {
    let (tmp, mounts) = fake_tree();
    Hierarchy::v1_at(mounts).create("", "run1", &CgroupLimits::default()).unwrap();
    for dir in ["memory", "pids", "cpu,cpuacct", "freezer"] {
        assert_eq!(fs::read_dir(tmp.path().join(dir).join("run1")).unwrap().count(), 0, "{dir}");
    }
}

#[test]
fn a_limit_for_a_missing_controller_fails_before_creating_anything() {
    let (tmp, mut mounts) = fake_tree();
    mounts.remove("cpu");
    let hierarchy = Hierarchy::v1_at(mounts);
    let err = hierarchy.create("sk", "run1", &all_limits()).unwrap_err();
    assert!(matches!(err, CgroupError::ControllerUnavailable { controller: "cpu", .. }), "{err}");
    assert!(!tmp.path().join("memory/sk/run1").exists());
    let cgroup = hierarchy.create("sk", "run1", &CgroupLimits::default()).unwrap();
    assert_eq!(cgroup.missing_controllers(), ["cpu"]);
}

#[test]
fn failure_half_way_removes_what_was_created() {
    let (tmp, mut mounts) = fake_tree();
    // Sorted after the real mounts, so memory, pids, ... are created before this one fails.
    mounts.insert("pids".to_owned(), tmp.path().join("zz-not-mounted"));
    let err = Hierarchy::v1_at(mounts).create("sk", "run1", &CgroupLimits::default()).unwrap_err();
    assert!(matches!(err, CgroupError::CreateDir { .. }), "{err}");
    for dir in ["memory", "cpu,cpuacct", "freezer"] {
        assert!(!tmp.path().join(dir).join("sk/run1").exists(), "{dir} left behind");
        assert!(tmp.path().join(dir).join("sk").exists(), "shared parent {dir} removed");
    }
}

#[test]
fn creating_an_existing_cgroup_fails_and_leaves_it_alone() {
    let (tmp, mounts) = fake_tree();
    let hierarchy = Hierarchy::v1_at(mounts);
    hierarchy.create("sk", "run1", &CgroupLimits::default()).unwrap();
    assert!(matches!(hierarchy.create("sk", "run1", &CgroupLimits::default()), Err(CgroupError::CreateDir { .. })));
    assert!(tmp.path().join("memory/sk/run1").is_dir());
}

#[test]
fn list_and_open_find_cgroups_in_any_controller() {
    let (tmp, mounts) = fake_tree();
    let hierarchy = Hierarchy::v1_at(mounts);
    let created = hierarchy.create("sk", "run1", &CgroupLimits::default()).unwrap();
    // A crashed run that got only as far as the pids controller.
    fs::create_dir(tmp.path().join("pids/sk/run2")).unwrap();
    assert_eq!(hierarchy.list("sk").unwrap(), ["run1", "run2"]);
    assert!(hierarchy.list("absent").unwrap().is_empty());
    assert_eq!(hierarchy.open("sk", "run1").unwrap(), Some(created));
    let partial = hierarchy.open("sk", "run2").unwrap().unwrap();
    assert_eq!(partial.paths(), [tmp.path().join("pids/sk/run2")]);
    assert_eq!(partial.missing_controllers(), ["cpu", "cpuacct", "freezer", "memory"]);
    assert_eq!(hierarchy.open("sk", "run3").unwrap(), None);
}

#[test]
fn add_process_writes_every_controller_and_pids_is_the_union() {
    let (tmp, mounts) = fake_tree();
    let cgroup = Hierarchy::v1_at(mounts).create("sk", "run1", &CgroupLimits::default()).unwrap();
    cgroup.add_process(4242).unwrap();
    for dir in cgroup.paths() {
        assert_eq!(read(&dir.join("cgroup.procs")), "4242");
    }
    fs::write(tmp.path().join("pids/sk/run1/cgroup.procs"), "4242\n7\n").unwrap();
    assert_eq!(cgroup.pids().unwrap(), [7, 4242]);
}

#[test]
fn remove_is_idempotent_and_only_uses_rmdir() {
    let (tmp, mounts) = fake_tree();
    let hierarchy = Hierarchy::v1_at(mounts);
    let cgroup = hierarchy.create("sk", "run1", &all_limits()).unwrap();
    // Files left in a dir: rmdir refuses, nothing is deleted recursively.
    assert!(matches!(cgroup.clone().remove(), Err(CgroupError::RemoveDir { .. })));
    assert!(tmp.path().join("memory/sk/run1/memory.limit_in_bytes").exists());
    for dir in cgroup.paths() {
        clear_files(&dir);
    }
    cgroup.clone().remove().unwrap();
    cgroup.remove().unwrap();
    assert!(hierarchy.list("sk").unwrap().is_empty());
    hierarchy.remove_parent("sk").unwrap();
    assert!(!tmp.path().join("memory/sk").exists());
    assert!(hierarchy.remove_parent("").is_err());
}

#[test]
fn kill_all_of_an_empty_or_missing_cgroup_is_fine() {
    let (_tmp, mounts) = fake_tree();
    let hierarchy = Hierarchy::v1_at(mounts);
    let cgroup = hierarchy.create("sk", "run1", &CgroupLimits::default()).unwrap();
    cgroup.kill_all().unwrap();
    for dir in cgroup.paths() {
        clear_files(&dir);
        fs::remove_dir(&dir).unwrap();
    }
    cgroup.kill_all().unwrap();
}

#[test]
fn describe_names_each_controller_and_the_missing_ones() {
    let (tmp, mut mounts) = fake_tree();
    mounts.remove("freezer");
    let line = Hierarchy::v1_at(mounts).describe();
    assert!(line.starts_with("cgroup v1:"), "{line}");
    assert!(line.contains(&format!("memory={} (writable)", tmp.path().join("memory").display())), "{line}");
    assert!(line.ends_with("; missing: freezer"), "{line}");
}

#[test]
fn names_that_escape_the_parent_are_rejected() {
    let (_tmp, mounts) = fake_tree();
    let hierarchy = Hierarchy::v1_at(mounts);
    for (parent, name) in [("sk", "../x"), ("..", "x"), ("/etc", "x"), ("sk", "")] {
        let err = hierarchy.create(parent, name, &CgroupLimits::default()).unwrap_err();
        assert!(matches!(err, CgroupError::InvalidName { .. }), "{parent:?} {name:?}: {err}");
    }
}
