//! The server crashes (`kill -9`), alone or together with its spawner: no sandbox process, cgroup or record may
//! outlive it, and after a restart the database says what happened to each sandbox (nothing is lost). The spawner
//! alone dying is survived: `/healthz` says 503 while it is down, creates are 503 (never 500), the server restarts
//! it, and its sandboxes are marked lost with nothing of them left. A spawner that cannot start at all (no cgroup
//! hierarchy) makes `serve` exit non-zero saying why.

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::time::{Duration, Instant};

use serde_json::json;
use serve::{KEY_1, Server, assert_sandbox_gone, children_of, wait_until_dead};

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

#[test]
fn kill_9_of_the_spawner_alone_is_503_then_it_is_restarted_and_its_sandboxes_are_lost() {
    require_root!();
    let server = Server::start_exclusive();
    let id = server.create(json!({}));
    let spawners = children_of(server.pid());
    assert_eq!(spawners.len(), 1, "the server runs exactly one spawner: {spawners:?}");
    // SAFETY: kill(2) of the spawner, a child of our child, which we just listed.
    unsafe { libc::kill(spawners[0] as libc::pid_t, libc::SIGKILL) };

    // While it is down: /healthz is 503 saying so, and a create is refused with 503 (or, once restarted, works) —
    // never a 500.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut saw_down = false;
    loop {
        let health = server.call("GET", "/healthz", KEY_1, None);
        match health.status {
            503 => {
                let reason = health.json["reason"].as_str().unwrap_or_default().to_owned();
                assert!(reason.contains("spawner"), "{health:?}");
                if !saw_down {
                    saw_down = true;
                    let create = server.call("POST", "/v1/sandboxes", KEY_1, Some(json!({})));
                    assert!(matches!(create.status, 201 | 503), "a create while the spawner is down: {create:?}");
                    if create.status == 503 {
                        assert_eq!(create.json["error"]["code"], "tier_failed", "{create:?}");
                    } else if let Some(other) = create.json["id"].as_str() {
                        server.call("DELETE", &format!("/v1/sandboxes/{other}"), KEY_1, None);
                    }
                }
            }
            200 if saw_down => break,
            200 => {}
            _ => panic!("/healthz answered {health:?}"),
        }
        assert!(Instant::now() < deadline, "the spawner was not restarted (down seen: {saw_down})");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(saw_down, "/healthz never said the spawner was down");
    let restarted = children_of(server.pid());
    assert_eq!(restarted.len(), 1, "{restarted:?}");
    assert_ne!(restarted[0], spawners[0], "the same spawner?");

    // Its sandbox died with it: nothing of it is left on the host, and the store says lost (its quota is free).
    assert_sandbox_gone(&id);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = server.call("GET", &format!("/v1/sandboxes/{id}"), KEY_1, None);
        if info.json["state"] == "lost" {
            break;
        }
        assert!(Instant::now() < deadline, "the dead sandbox is still recorded as {:?}", info.json["state"]);
        std::thread::sleep(Duration::from_millis(50));
    }
    // The restarted spawner works.
    let fresh = server.create(json!({}));
    assert_eq!(server.exec(&fresh, "echo alive").json["stdout"], "alive\n");
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{fresh}"), KEY_1, None).status, 204);
}

#[test]
fn a_spawner_that_cannot_start_makes_serve_exit_non_zero_saying_why() {
    require_root!();
    // In a mount namespace of its own without any cgroup mount, the spawner finds no hierarchy to put sandboxes in.
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("sandkasten.db");
    let script = format!(
        "umount -l /sys/fs/cgroup && exec {} serve --insecure-no-auth --listen 127.0.0.1:0 --database {}",
        common::bin(),
        database.display()
    );
    let started = Instant::now();
    let output = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env_remove("SANDKASTEN_API_KEYS")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "serve started without a cgroup hierarchy: {stderr}");
    assert!(stderr.contains("no usable cgroup hierarchy"), "the reason is not said: {stderr}");
    assert!(started.elapsed() < Duration::from_secs(20), "serve took {:?} to give up", started.elapsed());
    // The host's own cgroup mounts are untouched (the unmount happened in the test's namespace only).
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(mounts.contains(" - cgroup") || mounts.contains(" - cgroup2"), "the host lost its cgroup mounts");
}
