//! Unit tests of the v2 file logic on a fake unified tree.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::Path;

use tempfile::TempDir;

use super::*;
use crate::{CgroupVersion, Hierarchy};

/// A fake unified root offering `controllers`.
fn fake_root(controllers: &str) -> TempDir {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("cgroup.controllers"), controllers).unwrap();
    fs::write(tmp.path().join("cgroup.subtree_control"), "").unwrap();
    tmp
}

/// Pre-creates the parent the way the kernel would populate it once the root enabled `controllers`.
fn fake_parent(root: &Path, name: &str, controllers: &str) {
    let dir = root.join(name);
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("cgroup.controllers"), controllers).unwrap();
    fs::write(dir.join("cgroup.subtree_control"), "").unwrap();
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap().trim().to_owned()
}

fn clear_files(dir: &Path) {
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            fs::remove_file(entry.path()).unwrap();
        }
    }
}

#[test]
fn create_enables_controllers_and_writes_v2_limits() {
    let tmp = fake_root("cpuset cpu io memory pids");
    fake_parent(tmp.path(), "sk", "cpu memory pids");
    let limits = CgroupLimits {
        memory_bytes: Some(64 << 20),
        pids_max: Some(5),
        cpu_quota_us: Some(50_000),
        cpu_period_us: 100_000,
    };
    let cgroup = Hierarchy::v2_at(tmp.path().to_owned()).create("sk", "run1", &limits).unwrap();
    assert_eq!(cgroup.version(), CgroupVersion::V2);
    assert!(cgroup.missing_controllers().is_empty());
    let dir = tmp.path().join("sk/run1");
    assert_eq!(cgroup.paths(), std::slice::from_ref(&dir));
    // The fake files keep only the last write; the kernel would keep all three.
    assert_eq!(read(&tmp.path().join("cgroup.subtree_control")), "+cpu");
    assert_eq!(read(&tmp.path().join("sk/cgroup.subtree_control")), "+cpu");
    assert_eq!(read(&dir.join("memory.max")), "67108864");
    assert_eq!(read(&dir.join("pids.max")), "5");
    assert_eq!(read(&dir.join("cpu.max")), "50000 100000");
}

#[test]
fn swap_is_zero_when_swap_accounting_exists() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("memory.swap.max"), "max").unwrap();
    apply_limits(tmp.path(), &CgroupLimits { memory_bytes: Some(4096), ..CgroupLimits::default() }).unwrap();
    assert_eq!(read(&tmp.path().join("memory.swap.max")), "0");
    assert_eq!(read(&tmp.path().join("memory.max")), "4096");
}

#[test]
fn missing_controllers_are_reported_and_their_limits_refused() {
    let tmp = fake_root("hugetlb");
    let hierarchy = Hierarchy::v2_at(tmp.path().to_owned());
    let err =
        hierarchy.create("sk", "run1", &CgroupLimits { pids_max: Some(5), ..CgroupLimits::default() }).unwrap_err();
    assert!(matches!(err, CgroupError::ControllerUnavailable { controller: "pids", .. }), "{err}");
    assert!(!tmp.path().join("sk/run1").exists());
    let cgroup = hierarchy.create("sk", "run1", &CgroupLimits::default()).unwrap();
    assert_eq!(cgroup.missing_controllers(), ["memory", "pids", "cpu"]);
    // Nothing to enable: the root's subtree_control was not touched.
    assert_eq!(read(&tmp.path().join("cgroup.subtree_control")), "");
}

#[test]
fn already_enabled_controllers_are_not_rewritten() {
    let tmp = fake_root("memory pids");
    fs::write(tmp.path().join("cgroup.subtree_control"), "memory pids").unwrap();
    let cgroup = Hierarchy::v2_at(tmp.path().to_owned()).create("", "run1", &CgroupLimits::default()).unwrap();
    assert_eq!(cgroup.missing_controllers(), ["cpu"]);
    assert_eq!(read(&tmp.path().join("cgroup.subtree_control")), "memory pids");
}

#[test]
fn list_open_and_remove() {
    let tmp = fake_root("");
    let hierarchy = Hierarchy::v2_at(tmp.path().to_owned());
    let cgroup = hierarchy.create("sk", "run1", &CgroupLimits::default()).unwrap();
    hierarchy.create("sk", "run2", &CgroupLimits::default()).unwrap();
    assert_eq!(hierarchy.list("sk").unwrap(), ["run1", "run2"]);
    let opened = hierarchy.open("sk", "run1").unwrap().unwrap();
    assert_eq!(opened.paths(), cgroup.paths());
    assert_eq!(hierarchy.open("sk", "run9").unwrap(), None);
    cgroup.add_process(99).unwrap();
    assert_eq!(opened.pids().unwrap(), [99]);
    fs::write(tmp.path().join("sk/run1/cgroup.procs"), "").unwrap();
    clear_files(&tmp.path().join("sk/run1"));
    opened.clone().remove().unwrap();
    opened.remove().unwrap();
    assert_eq!(hierarchy.list("sk").unwrap(), ["run2"]);
}

#[test]
fn kill_all_with_cgroup_kill_on_an_empty_cgroup_returns_at_once() {
    let tmp = fake_root("");
    let cgroup = Hierarchy::v2_at(tmp.path().to_owned()).create("", "run1", &CgroupLimits::default()).unwrap();
    let dir = tmp.path().join("run1");
    fs::write(dir.join("cgroup.kill"), "").unwrap();
    cgroup.kill_all().unwrap();
    // Empty already: nothing was written.
    assert_eq!(read(&dir.join("cgroup.kill")), "");
}

#[test]
fn describe_lists_available_and_missing_controllers() {
    let tmp = fake_root("cpu hugetlb memory");
    let line = Hierarchy::v2_at(tmp.path().to_owned()).describe();
    assert_eq!(line, format!("cgroup v2 at {} (writable): available: memory cpu; missing: pids", tmp.path().display()));
}
