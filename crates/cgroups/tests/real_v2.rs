//! Real-kernel test against the host's cgroup2 mount (here the controller-less `/sys/fs/cgroup/unified`
//! of a hybrid host): create, add a process, kill through `cgroup.kill`, remove, nothing left behind; `cgroup.freeze`
//! stops a busy loop's CPU and thawing lets it run (the process tier's pause on a v2 host).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::process::ExitStatusExt as _;

use common::{
    Guard, assert_all_dead, assert_freeze_stops_cpu_and_thaw_resumes, cgroup2_mount, is_root, open_gate, wait_for_pids,
};
use sandkasten_cgroups::{CgroupLimits, CgroupVersion, Hierarchy};

#[test]
fn v2_kill_all_through_cgroup_kill_and_remove() {
    if !is_root() {
        eprintln!("skipped: not root");
        return;
    }
    let Some(root) = cgroup2_mount() else {
        eprintln!("skipped: no cgroup2 mount");
        return;
    };
    let hierarchy = Hierarchy::v2_at(root);
    eprintln!("{}", hierarchy.describe());
    let mut guard = Guard::new(hierarchy, "v2");
    let cgroup = guard.hierarchy.create(&guard.parent, "run", &CgroupLimits::default()).unwrap();
    assert_eq!(cgroup.version(), CgroupVersion::V2);
    eprintln!("missing controllers: {:?}", cgroup.missing_controllers());
    let dir = cgroup.paths().remove(0);
    assert!(dir.join("cgroup.kill").exists(), "kernel without cgroup.kill");
    let (pid, gate) = guard.spawn_gated("sleep 1000 & exec sleep 1000");
    cgroup.add_process(pid).unwrap();
    open_gate(gate);
    let inside = wait_for_pids(&cgroup, 2);
    assert!(inside.contains(&pid));
    cgroup.kill_all().unwrap();
    assert!(cgroup.pids().unwrap().is_empty());
    assert_eq!(guard.reap(pid).signal(), Some(9));
    assert_all_dead(&inside);
    let usage = cgroup.usage().unwrap();
    eprintln!("{usage:?}");
    let paths = cgroup.paths();
    cgroup.remove().unwrap();
    guard.finish(&paths);
}

#[test]
fn v2_freeze_stops_a_busy_loop_and_thaw_resumes_it() {
    if !is_root() {
        eprintln!("skipped: not root");
        return;
    }
    let Some(root) = cgroup2_mount() else {
        eprintln!("skipped: no cgroup2 mount");
        return;
    };
    let mut guard = Guard::new(Hierarchy::v2_at(root), "v2-freeze");
    let cgroup = guard.hierarchy.create(&guard.parent, "run", &CgroupLimits::default()).unwrap();
    assert_eq!(cgroup.version(), CgroupVersion::V2);
    let (pid, gate) = guard.spawn_gated("while :; do :; done");
    cgroup.add_process(pid).unwrap();
    open_gate(gate);
    wait_for_pids(&cgroup, 1);
    assert_freeze_stops_cpu_and_thaw_resumes(&cgroup, pid);
    let events = std::fs::read_to_string(cgroup.paths()[0].join("cgroup.events")).unwrap();
    assert!(events.contains("frozen 0"), "{events}");
    cgroup.kill_all().unwrap();
    assert_eq!(guard.reap(pid).signal(), Some(9));
    let paths = cgroup.paths();
    cgroup.remove().unwrap();
    guard.finish(&paths);
}
