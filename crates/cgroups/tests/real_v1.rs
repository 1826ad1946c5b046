//! Real-kernel tests on a cgroup v1 host (run as root; skipped with a reason otherwise): kills reach
//! forked descendants, memory and pids limits are enforced, and nothing is left behind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::os::unix::process::ExitStatusExt as _;
use std::thread;
use std::time::{Duration, Instant};

use common::{Guard, assert_all_dead, assert_freeze_stops_cpu_and_thaw_resumes, is_root, open_gate, wait_for_pids};
use sandkasten_cgroups::{CgroupError, CgroupLimits, CgroupVersion, Hierarchy};

/// The host's v1 hierarchy, or `None` (with the reason printed) when the test cannot run here.
fn v1_host() -> Option<Hierarchy> {
    if !is_root() {
        eprintln!("skipped: not root");
        return None;
    }
    match Hierarchy::detect() {
        Ok(h) if h.version() == CgroupVersion::V1 => Some(h),
        Ok(h) => {
            eprintln!("skipped: host is not cgroup v1 ({})", h.describe());
            None
        }
        Err(err) => {
            eprintln!("skipped: no cgroup hierarchy: {err}");
            None
        }
    }
}

#[test]
fn kill_all_reaches_children_and_forked_grandchildren() {
    let Some(hierarchy) = v1_host() else { return };
    let mut guard = Guard::new(hierarchy, "kill");
    let cgroup = guard.hierarchy.create(&guard.parent, "run", &CgroupLimits::default()).unwrap();
    assert!(cgroup.missing_controllers().is_empty(), "{:?}", cgroup.missing_controllers());
    let mut direct = Vec::new();
    for script in ["exec sleep 1000", "exec sleep 1000", "sleep 1000 & exec sleep 1000"] {
        let (pid, gate) = guard.spawn_gated(script);
        cgroup.add_process(pid).unwrap();
        open_gate(gate);
        direct.push(pid);
    }
    let inside = wait_for_pids(&cgroup, 4);
    assert!(direct.iter().all(|pid| inside.contains(pid)), "{direct:?} not all in {inside:?}");
    cgroup.kill_all().unwrap();
    assert!(cgroup.pids().unwrap().is_empty());
    for pid in &direct {
        assert_eq!(guard.reap(*pid).signal(), Some(libc_sigkill()));
    }
    assert_all_dead(&inside);
    let freezer = cgroup.controller_path("freezer").unwrap();
    assert_eq!(fs::read_to_string(freezer.join("freezer.state")).unwrap().trim(), "THAWED");
    let paths = cgroup.paths();
    cgroup.remove().unwrap();
    guard.finish(&paths);
}

#[test]
fn fork_loop_is_killed_completely() {
    let Some(hierarchy) = v1_host() else { return };
    let mut guard = Guard::new(hierarchy, "forkloop");
    let limits = CgroupLimits { pids_max: Some(64), ..CgroupLimits::default() };
    let cgroup = guard.hierarchy.create(&guard.parent, "run", &limits).unwrap();
    let (pid, gate) = guard.spawn_gated("while true; do sleep 1000 & done");
    cgroup.add_process(pid).unwrap();
    open_gate(gate);
    let before = wait_for_pids(&cgroup, 20);
    cgroup.kill_all().unwrap();
    assert!(cgroup.pids().unwrap().is_empty());
    guard.reap(pid);
    assert_all_dead(&before);
    let paths = cgroup.paths();
    cgroup.remove().unwrap();
    guard.finish(&paths);
}

#[test]
fn memory_limit_oom_kills_inside_the_cgroup() {
    let Some(hierarchy) = v1_host() else { return };
    let mut guard = Guard::new(hierarchy, "oom");
    let limit = 64 << 20;
    let limits = CgroupLimits { memory_bytes: Some(limit), ..CgroupLimits::default() };
    let cgroup = guard.hierarchy.create(&guard.parent, "run", &limits).unwrap();
    let memory = cgroup.controller_path("memory").unwrap();
    for file in ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"] {
        assert_eq!(fs::read_to_string(memory.join(file)).unwrap().trim(), limit.to_string(), "{file}");
    }
    let (pid, gate) = guard.spawn_gated("exec /usr/bin/python3 -c 'b = bytearray(200 << 20)'");
    cgroup.add_process(pid).unwrap();
    open_gate(gate);
    let status = guard.reap(pid);
    assert_eq!(status.signal(), Some(libc_sigkill()), "python was not OOM-killed: {status:?}");
    let usage = cgroup.usage().unwrap();
    assert!(usage.oom_kills >= 1, "{usage:?}");
    assert!(usage.memory_peak_bytes > 0 && usage.memory_peak_bytes <= limit, "{usage:?}");
    let paths = cgroup.paths();
    cgroup.remove().unwrap();
    guard.finish(&paths);
}

#[test]
fn fork_bomb_hits_the_pids_limit() {
    let Some(hierarchy) = v1_host() else { return };
    let mut guard = Guard::new(hierarchy, "pids");
    let limits = CgroupLimits { pids_max: Some(5), ..CgroupLimits::default() };
    let cgroup = guard.hierarchy.create(&guard.parent, "run", &limits).unwrap();
    let (pid, gate) = guard.spawn_gated("for i in 1 2 3 4 5 6 7 8 9 10; do sleep 1000 & done; wait");
    cgroup.add_process(pid).unwrap();
    open_gate(gate);
    let deadline = Instant::now() + Duration::from_secs(5);
    while cgroup.usage().unwrap().pids_limit_hits == 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    let usage = cgroup.usage().unwrap();
    assert!(usage.pids_limit_hits >= 1, "{usage:?}");
    assert!(cgroup.pids().unwrap().len() <= 5);
    cgroup.kill_all().unwrap();
    guard.reap_all();
    let paths = cgroup.paths();
    cgroup.remove().unwrap();
    guard.finish(&paths);
}

#[test]
fn cpu_limit_is_written_and_usage_counts_cpu_time() {
    let Some(hierarchy) = v1_host() else { return };
    let mut guard = Guard::new(hierarchy, "cpu");
    let limits = CgroupLimits { cpu_quota_us: Some(50_000), cpu_period_us: 100_000, ..CgroupLimits::default() };
    let cgroup = guard.hierarchy.create(&guard.parent, "run", &limits).unwrap();
    let cpu = cgroup.controller_path("cpu").unwrap();
    assert_eq!(fs::read_to_string(cpu.join("cpu.cfs_quota_us")).unwrap().trim(), "50000");
    assert_eq!(fs::read_to_string(cpu.join("cpu.cfs_period_us")).unwrap().trim(), "100000");
    let (pid, gate) = guard.spawn_gated("i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done");
    cgroup.add_process(pid).unwrap();
    open_gate(gate);
    assert!(guard.reap(pid).success());
    let usage = cgroup.usage().unwrap();
    assert!(usage.cpu_user_ns + usage.cpu_system_ns > 0, "{usage:?}");
    let paths = cgroup.paths();
    cgroup.remove().unwrap();
    guard.finish(&paths);
}

#[test]
fn freezer_stops_a_busy_loop_and_thaw_resumes_it() {
    let Some(hierarchy) = v1_host() else { return };
    let mut guard = Guard::new(hierarchy, "freeze");
    let cgroup = guard.hierarchy.create(&guard.parent, "run", &CgroupLimits::default()).unwrap();
    let (pid, gate) = guard.spawn_gated("while :; do :; done");
    cgroup.add_process(pid).unwrap();
    open_gate(gate);
    wait_for_pids(&cgroup, 1);
    assert_freeze_stops_cpu_and_thaw_resumes(&cgroup, pid);
    cgroup.kill_all().unwrap();
    assert_eq!(guard.reap(pid).signal(), Some(9));
    let paths = cgroup.paths();
    cgroup.remove().unwrap();
    guard.finish(&paths);
}

#[test]
fn memory_now_shows_what_a_process_holds_apart_from_file_cache() {
    let Some(hierarchy) = v1_host() else { return };
    let mut guard = Guard::new(hierarchy, "memory-now");
    let limits = CgroupLimits { memory_bytes: Some(256 << 20), ..CgroupLimits::default() };
    let cgroup = guard.hierarchy.create(&guard.parent, "run", &limits).unwrap();
    // 48 MiB of touched anonymous memory, and a 16 MiB file written from inside (its page cache is the cgroup's).
    // (In cargo's target directory: a disk, where `/tmp` may be a tmpfs, whose pages are not file cache.)
    let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("memory-now-{}", std::process::id()));
    let script = format!(
        "exec /usr/bin/python3 -c 'import time; open(\"{}\", \"wb\").write(bytes(16 << 20)); \
         b = bytearray(48 << 20); time.sleep(60)'",
        file.display()
    );
    let (pid, gate) = guard.spawn_gated(&script);
    cgroup.add_process(pid).unwrap();
    open_gate(gate);
    let deadline = Instant::now() + Duration::from_secs(20);
    let now = loop {
        let now = cgroup.memory_now().unwrap();
        if (now.used_bytes >= 48 << 20 && now.cache_bytes >= 8 << 20) || Instant::now() > deadline {
            break now;
        }
        thread::sleep(Duration::from_millis(50));
    };
    let _ = fs::remove_file(&file);
    assert!(now.used_bytes >= 48 << 20 && now.used_bytes < 200 << 20, "{now:?}");
    assert!(now.cache_bytes >= 8 << 20, "the file's page cache is not counted apart: {now:?}");
    cgroup.kill_all().unwrap();
    guard.reap(pid);
    let paths = cgroup.paths();
    cgroup.remove().unwrap();
    guard.finish(&paths);
}

#[test]
fn crashed_runs_are_found_by_list_and_open() {
    let Some(hierarchy) = v1_host() else { return };
    let mut guard = Guard::new(hierarchy, "gc");
    let first = guard.hierarchy.create(&guard.parent, "a", &CgroupLimits::default()).unwrap();
    guard.hierarchy.create(&guard.parent, "b", &CgroupLimits::default()).unwrap();
    let (pid, gate) = guard.spawn_gated("exec sleep 1000");
    first.add_process(pid).unwrap();
    open_gate(gate);
    assert_eq!(guard.hierarchy.list(&guard.parent).unwrap(), ["a", "b"]);
    let mut paths = Vec::new();
    for name in ["a", "b"] {
        let cgroup = guard.hierarchy.open(&guard.parent, name).unwrap().unwrap();
        paths.extend(cgroup.paths());
        cgroup.remove().unwrap();
    }
    assert_eq!(guard.reap(pid).signal(), Some(libc_sigkill()));
    assert!(guard.hierarchy.list(&guard.parent).unwrap().is_empty());
    assert!(guard.hierarchy.open(&guard.parent, "a").unwrap().is_none());
    guard.finish(&paths);
}

#[test]
fn a_limit_the_kernel_rejects_fails_and_leaves_nothing() {
    let Some(hierarchy) = v1_host() else { return };
    let guard = Guard::new(hierarchy, "reject");
    // The kernel refuses CFS quotas below 1 ms with EINVAL.
    let limits = CgroupLimits { memory_bytes: Some(64 << 20), cpu_quota_us: Some(10), ..CgroupLimits::default() };
    let err = guard.hierarchy.create(&guard.parent, "run", &limits).unwrap_err();
    match &err {
        CgroupError::Write { path, .. } => assert!(path.ends_with("cpu.cfs_quota_us"), "{err}"),
        other => panic!("expected a write error, got {other}"),
    }
    assert!(guard.hierarchy.list(&guard.parent).unwrap().is_empty());
    assert!(guard.hierarchy.open(&guard.parent, "run").unwrap().is_none());
    guard.finish(&[]);
}

/// SIGKILL's number (9 on every Linux architecture).
fn libc_sigkill() -> i32 {
    9
}
