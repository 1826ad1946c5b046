//! `sandkasten gc` removes what a crashed owner left behind (a record whose owner is dead, its cgroups, the processes
//! in them) and leaves alone sandboxes whose owner is alive.

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::*;

/// A sandbox-shaped id (`sb-` + 16 hex digits) that no real run will produce at the same time.
fn fake_id() -> String {
    let token = unique_token("");
    let hex: String = token.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    let tail = &hex[hex.len().saturating_sub(16)..];
    format!("sb-{tail:0>16}")
}

fn start_ticks(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 1..];
    after.split_whitespace().nth(19).unwrap().parse().unwrap()
}

fn write_record(id: &str, owner_pid: u32, owner_start_ticks: u64) {
    fs::create_dir_all(RECORD_DIR).unwrap();
    let record = serde_json::json!({
        "id": id, "tier": "process", "owner_pid": owner_pid, "owner_start_ticks": owner_start_ticks,
        "cgroup_parent": "sandkasten", "created_unix_ms": 0u64,
    });
    fs::write(record_path(id), record.to_string()).unwrap();
}

/// Creates the sandbox's v1 cgroups (where the controller is mounted) and returns them.
fn make_cgroups(id: &str) -> Vec<PathBuf> {
    let mut made = Vec::new();
    for c in V1_CONTROLLERS {
        let controller = PathBuf::from(format!("/sys/fs/cgroup/{c}"));
        if !controller.join("cgroup.procs").exists() {
            continue;
        }
        let dir = controller.join("sandkasten").join(id);
        // The runtime may remove the shared parent concurrently: retry.
        for _ in 0..20 {
            if fs::create_dir_all(&dir).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(dir.exists(), "could not create {}", dir.display());
        made.push(dir);
    }
    made
}

fn gc() -> Output {
    Cli::new(["gc"]).output()
}

#[test]
fn gc_removes_stale_record_cgroups_and_processes() {
    require_root!();
    let id = fake_id();
    let mut dead = Command::new("/bin/true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    // Set up under a live owner (this test), so no concurrent gc collects it half-built; then let the owner "die".
    let me = std::process::id();
    write_record(&id, me, start_ticks(me));
    let cgroups = make_cgroups(&id);
    assert!(!cgroups.is_empty(), "no v1 controller to test with");
    // A leftover "sandbox process": a host process with a token, moved into the stale sandbox's cgroups.
    let token = unique_token("GCLEFTOVER");
    let mut leftover =
        Command::new("/usr/bin/python3").args(["-c", "import time; time.sleep(300)", &token]).spawn().unwrap();
    for dir in &cgroups {
        fs::write(dir.join("cgroup.procs"), leftover.id().to_string()).unwrap();
    }
    assert!(!processes_in_cgroup_matching(&id).is_empty(), "positive control: the leftover is in the cgroup");
    write_record(&id, dead_pid, 1);
    let out = gc();
    assert_eq!(out.code, 0, "{}", out.describe());
    let status = (0..100).find_map(|_| {
        let s = leftover.try_wait().ok().flatten();
        if s.is_none() {
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    });
    if status.is_none() {
        let _ = leftover.kill();
        let _ = leftover.wait();
        panic!("gc left the stale sandbox's process alive\n{}", out.describe());
    }
    assert_no_token_processes(&token);
    assert_no_leaks(&id);
}

#[test]
fn gc_keeps_sandboxes_of_live_owners() {
    require_root!();
    let id = fake_id();
    let me = std::process::id();
    write_record(&id, me, start_ticks(me));
    let cgroups = make_cgroups(&id);
    let out = gc();
    let record_kept = record_path(&id).exists();
    let cgroups_kept = cgroups.iter().all(|d| d.exists());
    // Clean up before asserting.
    for dir in &cgroups {
        let _ = fs::remove_dir(dir);
    }
    let _ = fs::remove_file(record_path(&id));
    assert_eq!(out.code, 0, "{}", out.describe());
    assert!(record_kept, "gc removed the record of a live owner\n{}", out.describe());
    assert!(cgroups_kept, "gc removed the cgroups of a live owner\n{}", out.describe());
}

#[test]
fn gc_treats_recycled_owner_pid_as_dead() {
    require_root!();
    let id = fake_id();
    let me = std::process::id();
    write_record(&id, me, start_ticks(me));
    let _cgroups = make_cgroups(&id);
    // The pid is alive, but its start time does not match: a recycled pid, not the owner.
    write_record(&id, me, start_ticks(me) + 12345);
    let out = gc();
    assert_eq!(out.code, 0, "{}", out.describe());
    assert_no_leaks(&id);
}

#[test]
fn concurrent_gc_runs_do_not_fail() {
    require_root!();
    // `run` collects stale records automatically, so several gc passes can meet on the same leftovers: the loser of
    // each race must treat "already gone" as done, not fail.
    let me = std::process::id();
    let ids: Vec<String> = (0..12).map(|_| fake_id()).collect();
    for id in &ids {
        write_record(id, me, start_ticks(me));
        make_cgroups(id);
        write_record(id, me, start_ticks(me) + 777);
    }
    let handles: Vec<_> = (0..6).map(|_| std::thread::spawn(gc)).collect();
    let outputs: Vec<Output> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for id in &ids {
        assert_no_leaks(id);
    }
    let failed: Vec<String> = outputs.iter().filter(|o| o.code != 0).map(Output::describe).collect();
    assert!(failed.is_empty(), "{} of 6 concurrent gc runs failed:\n{}", failed.len(), failed.join("\n"));
}
