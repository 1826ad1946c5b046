//! Pause and resume against a real `sandkasten serve` (#12, item 1). On the process tier a paused sandbox is frozen:
//! its busy loop gets no CPU (measured on the host, from the process's own CPU time), requests answer 409 `paused`,
//! its timeout clock stands still and it leaves the running quota; resume continues where it was (the same loop, the
//! same files). A sandbox created with `lifecycle.auto_resume` is resumed by a request. A tier that cannot pause yet
//! (gVisor) answers 409 naming the tier that can, and nothing changes.
//!
//! Every test runs on each isolation tier (`process::NAME` and `gvisor::NAME`, see `per_tier!`).

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::time::{Duration, Instant};

use common::Tier;
use serde_json::{Value, json};
use serve::{KEY_1, Server};

per_tier!(
    a_paused_sandbox_gets_no_cpu_answers_409_and_resumes_where_it_was,
    auto_resume_resumes_on_a_request,
    the_cli_pauses_and_resumes,
    auto_pause_pauses_at_the_timeout_where_the_tier_can,
    kill_9_of_the_server_and_its_spawner_with_a_paused_sandbox_leaves_nothing,
);

/// CPU time (user + system) of a host process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some(close) = stat.rfind(')') else { return 0 };
    let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
    fields.get(11).and_then(|t| t.parse::<u64>().ok()).unwrap_or(0)
        + fields.get(12).and_then(|t| t.parse::<u64>().ok()).unwrap_or(0)
}

fn call(server: &Server, method: &str, path: &str, body: Option<Value>) -> serve::Reply {
    server.call(method, path, KEY_1, body)
}

fn a_paused_sandbox_gets_no_cpu_answers_409_and_resumes_where_it_was(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({"timeout_s": 600}));
    let base = format!("/v1/sandboxes/{id}");
    if tier == Tier::Gvisor {
        let refused = call(&server, "POST", &format!("{base}/pause"), None);
        assert_eq!(refused.status, 409, "{refused:?}");
        let message = refused.json["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("process"), "the refusal names the tier that can: {message}");
        assert_eq!(call(&server, "GET", &base, None).json["state"], "running");
        assert_eq!(server.exec(&id, "echo still here").json["stdout"], "still here\n");
        return;
    }
    let token = format!("busy-{}", std::process::id());
    assert_eq!(server.exec(&id, "echo kept > /workspace/before").status, 200);
    let started = call(
        &server,
        "POST",
        &format!("{base}/exec"),
        Some(json!({"cmd": format!("exec -a {token} bash -c 'while :; do :; done'"), "background": true})),
    );
    assert_eq!(started.status, 202, "{started:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let pid = loop {
        if let Some((pid, _)) = common::token_processes(&token).into_iter().next() {
            break pid;
        }
        assert!(Instant::now() < deadline, "the busy loop did not start");
        std::thread::sleep(Duration::from_millis(50));
    };
    let expires_before = call(&server, "GET", &base, None).json["expires_at"].clone();

    let paused = call(&server, "POST", &format!("{base}/pause"), None);
    assert_eq!((paused.status, paused.json["state"].as_str()), (200, Some("paused")), "{paused:?}");
    let ticks = cpu_ticks(pid);
    std::thread::sleep(Duration::from_millis(1500));
    let used_ms = (cpu_ticks(pid) - ticks) * 10;
    assert!(used_ms <= 20, "the paused busy loop used {used_ms} ms of CPU in 1.5 s");
    let refused = call(&server, "POST", &format!("{base}/exec"), Some(json!({"cmd": "true"})));
    assert_eq!((refused.status, refused.json["error"]["code"].as_str()), (409, Some("paused")), "{refused:?}");
    assert_eq!(call(&server, "POST", &format!("{base}/pause"), None).status, 409, "paused already");
    let listed = call(&server, "GET", "/v1/sandboxes?state=paused", None);
    let ids: Vec<&str> = listed.json["sandboxes"].as_array().unwrap().iter().filter_map(|s| s["id"].as_str()).collect();
    assert!(ids.contains(&id.as_str()), "the list of paused sandboxes shows it: {listed:?}");

    let resumed = call(&server, "POST", &format!("{base}/resume"), None);
    assert_eq!((resumed.status, resumed.json["state"].as_str()), (200, Some("running")), "{resumed:?}");
    assert_ne!(resumed.json["expires_at"], expires_before, "the timeout clock stood still while paused");
    let ticks = cpu_ticks(pid);
    std::thread::sleep(Duration::from_millis(500));
    assert!(cpu_ticks(pid) > ticks, "the same busy loop runs again after the resume");
    assert_eq!(server.exec(&id, "cat /workspace/before").json["stdout"], "kept\n");
    assert_eq!(call(&server, "POST", &format!("{base}/resume"), None).status, 409, "not paused any more");
    // A paused sandbox can be deleted, and nothing of it is left.
    assert_eq!(call(&server, "POST", &format!("{base}/pause"), None).status, 200);
    assert_eq!(call(&server, "DELETE", &base, None).status, 204);
    serve::assert_sandbox_gone_on(tier, &id);
}

fn auto_resume_resumes_on_a_request(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({"lifecycle": {"auto_resume": true}}));
    let base = format!("/v1/sandboxes/{id}");
    let paused = call(&server, "POST", &format!("{base}/pause"), None);
    if tier == Tier::Gvisor {
        assert_eq!(paused.status, 409, "{paused:?}");
        return;
    }
    assert_eq!(paused.status, 200, "{paused:?}");
    let answered = server.exec(&id, "echo awake");
    assert_eq!((answered.status, answered.json["stdout"].as_str()), (200, Some("awake\n")), "{answered:?}");
    assert_eq!(call(&server, "GET", &base, None).json["state"], "running");
}

fn the_cli_pauses_and_resumes(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({}));
    let cli = |action: &str| {
        std::process::Command::new(common::bin())
            .args(["sandbox", "--url", &server.url, action, &id])
            .env("SANDKASTEN_API_KEY", KEY_1)
            .output()
            .unwrap()
    };
    let paused = cli("pause");
    let state = || call(&server, "GET", &format!("/v1/sandboxes/{id}"), None).json["state"].clone();
    if tier == Tier::Gvisor {
        assert!(!paused.status.success(), "pausing a gVisor sandbox is refused");
        assert!(String::from_utf8_lossy(&paused.stderr).contains("process"), "{paused:?}");
        assert_eq!(state(), "running");
        return;
    }
    assert!(paused.status.success(), "{paused:?}");
    assert_eq!(String::from_utf8_lossy(&paused.stdout).trim(), id);
    assert_eq!(state(), "paused");
    let resumed = cli("resume");
    assert!(resumed.status.success(), "{resumed:?}");
    assert_eq!(state(), "running");
}

fn auto_pause_pauses_at_the_timeout_where_the_tier_can(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({"timeout_s": 1, "lifecycle": {"auto_pause": true}}));
    // A tier that cannot pause ends the sandbox at its timeout as usual.
    let expected = if tier == Tier::Gvisor { "expired" } else { "paused" };
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let state = call(&server, "GET", &format!("/v1/sandboxes/{id}"), None).json["state"].clone();
        if state == expected {
            break;
        }
        assert!(Instant::now() < deadline, "the sandbox is {state} long after its timeout, not {expected}");
        std::thread::sleep(Duration::from_millis(200));
    }
    if tier == Tier::Process {
        // It stays paused (its clock stands still): not expired a few sweeps later.
        std::thread::sleep(Duration::from_millis(2500));
        assert_eq!(call(&server, "GET", &format!("/v1/sandboxes/{id}"), None).json["state"], "paused");
        let resumed = call(&server, "POST", &format!("/v1/sandboxes/{id}/resume"), None);
        assert_eq!(resumed.status, 200, "{resumed:?}");
        // Resumed after its timeout: it gets the server's default timeout again, not a second's sweep.
        std::thread::sleep(Duration::from_millis(2500));
        assert_eq!(server.exec(&id, "echo back").json["stdout"], "back\n");
    }
}

fn kill_9_of_the_server_and_its_spawner_with_a_paused_sandbox_leaves_nothing(tier: Tier) {
    // Exclusive: what a crash leaves is collected by the next spawner; no other run may take it first.
    let mut server = Server::start_exclusive_on(tier);
    let id = server.create_on(tier, json!({}));
    let started = call(
        &server,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"cmd": "sleep 600", "background": true})),
    );
    assert_eq!(started.status, 202, "{started:?}");
    let paused = call(&server, "POST", &format!("/v1/sandboxes/{id}/pause"), None);
    assert_eq!(paused.status, if tier == Tier::Process { 200 } else { 409 }, "{paused:?}");
    let spawners = serve::children_of(server.pid());
    // SAFETY: kill(2) of the spawner, a child of our child, which we just listed.
    unsafe { libc::kill(spawners[0] as libc::pid_t, libc::SIGKILL) };
    server.stop_with(libc::SIGKILL);
    server.relaunch();
    // The next spawner's gc removes the frozen cgroup and everything in it; the restart marks the sandbox lost.
    serve::assert_sandbox_gone_on(tier, &id);
    assert_eq!(call(&server, "GET", &format!("/v1/sandboxes/{id}"), None).json["state"], "lost");
}
