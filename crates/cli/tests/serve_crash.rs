//! The server crashes (`kill -9`), alone or together with its spawner: no sandbox process, cgroup or record may
//! outlive it, and after a restart the database says what happened to each sandbox (nothing is lost).

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::time::{Duration, Instant};

use serde_json::json;
use serve::{KEY_1, Server, assert_sandbox_gone};

/// Pids of the server's children (its spawner).
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn wait_until_dead(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z")
    {
        assert!(Instant::now() < deadline, "process {pid} did not die");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn crash_and_restart(kill_spawner_too: bool) {
    require_root!();
    // Exclusive: a sandbox left by a crash is only collected by the next spawner; no other run may take it first.
    let mut server = Server::start_exclusive();
    let ids: Vec<String> = (0..3).map(|_| server.create(json!({}))).collect();
    // One sandbox is busy when the crash comes.
    let busy = ids[0].clone();
    let url = server.url.clone();
    let background = std::thread::spawn(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let _ = agent
            .post(format!("{url}/v1/sandboxes/{busy}/exec"))
            .header("Authorization", format!("Bearer {KEY_1}"))
            .send_json(json!({"cmd": "sleep 30"}));
    });
    std::thread::sleep(Duration::from_millis(300));
    let spawners = children_of(server.pid());
    assert_eq!(spawners.len(), 1, "the server runs exactly one spawner: {spawners:?}");
    if kill_spawner_too {
        // SAFETY: kill(2) of the spawner, a child of our child, which we just listed.
        unsafe { libc::kill(spawners[0] as libc::pid_t, libc::SIGKILL) };
    }
    server.stop_with(libc::SIGKILL);
    wait_until_dead(spawners[0]);
    background.join().unwrap();

    // Without its owner, no sandbox keeps running.
    for id in &ids {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !common::processes_in_cgroup_matching(id).is_empty() {
            assert!(Instant::now() < deadline, "sandbox {id} still runs after the crash");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    server.relaunch();
    for id in &ids {
        assert_sandbox_gone(id);
        let info = server.call("GET", &format!("/v1/sandboxes/{id}"), KEY_1, None);
        assert_eq!(info.status, 200, "the record of {id} survived the crash: {info:?}");
        assert_eq!(info.json["state"], "lost", "{info:?}");
    }
    // The restarted server works.
    let id = server.create(json!({}));
    assert_eq!(server.exec(&id, "echo alive").json["stdout"], "alive\n");
}

#[test]
fn kill_9_of_the_server_destroys_its_sandboxes_and_restart_marks_them_lost() {
    crash_and_restart(false);
}

#[test]
fn kill_9_of_server_and_spawner_leaves_nothing_after_restart() {
    crash_and_restart(true);
}

#[test]
fn sigterm_drains_and_destroys_every_sandbox() {
    require_root!();
    let mut server = Server::start();
    let ids: Vec<String> = (0..3).map(|_| server.create(json!({}))).collect();
    server.stop_with(libc::SIGTERM);
    for id in &ids {
        assert_sandbox_gone(id);
    }
    // Other tests' sandboxes may legitimately keep the parent alive (it then has children); a childless parent that
    // stays for a whole second is a leak.
    let childless_parents = || -> Vec<String> {
        common::V1_CONTROLLERS
            .iter()
            .map(|c| format!("/sys/fs/cgroup/{c}/sandkasten"))
            .chain(["/sys/fs/cgroup/sandkasten".to_owned()])
            .filter(|p| std::fs::read_dir(p).is_ok_and(|entries| !entries.flatten().any(|e| e.path().is_dir())))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let left = childless_parents();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "the shared cgroup parent outlived the server: {left:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
