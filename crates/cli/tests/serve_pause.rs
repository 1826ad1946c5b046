//! Pause and resume against a real `sandkasten serve` (#12, item 1). On the process tier a paused sandbox is frozen:
//! its busy loop gets no CPU (measured on the host, from the process's own CPU time), requests answer 409 `paused`,
//! its timeout clock stands still and it leaves the running quota; resume continues where it was (the same loop, the
//! same files). On gVisor a paused sandbox is checkpointed to disk: no host process names it and its cgroup is gone;
//! resume restores it with a Python context's variables and open files, a background command that keeps producing
//! output on the same stream, and its files. A sandbox created with `lifecycle.auto_resume` is resumed by a request.
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

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
    // Commands may run a minute: the gVisor branch's 40 ticks (80 processes under gVisor) took over the default 10 s
    // on a loaded host, and what is tested is that they run on after the resume, not how fast.
    let id = server.create_on(tier, json!({"timeout_s": 600, "limits": {"timeout_ms": 60000}}));
    let base = format!("/v1/sandboxes/{id}");
    if tier != Tier::Process {
        return a_released_sandbox_holds_nothing_on_the_host_and_resumes_where_it_was(&server, tier, &id);
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
    assert!(paused.status.success(), "{paused:?}");
    assert_eq!(String::from_utf8_lossy(&paused.stdout).trim(), id);
    assert_eq!(state(), "paused");
    let resumed = cli("resume");
    assert!(resumed.status.success(), "{resumed:?}");
    assert_eq!(state(), "running");
    assert_eq!(server.exec(&id, "echo after").json["stdout"], "after\n");
}

fn auto_pause_pauses_at_the_timeout_where_the_tier_can(tier: Tier) {
    let server = Server::start_on(tier);
    // The timeout counts from the create, which on a microVM includes its boot (seconds under emulation).
    let timeout_s = if tier == Tier::Microvm { 8 } else { 1 };
    let id = server.create_on(tier, json!({"timeout_s": timeout_s, "lifecycle": {"auto_pause": true}}));
    let expected = "paused";
    let deadline = Instant::now() + Duration::from_secs(15 + timeout_s);
    loop {
        let state = call(&server, "GET", &format!("/v1/sandboxes/{id}"), None).json["state"].clone();
        if state == expected {
            break;
        }
        assert!(Instant::now() < deadline, "the sandbox is {state} long after its timeout, not {expected}");
        std::thread::sleep(Duration::from_millis(200));
    }
    if tier != Tier::Process {
        // The database says paused first, the runtime follows: its memory saved, its cgroup gone.
        let deadline = Instant::now() + Duration::from_secs(10);
        while common::cgroup_paths(&id).iter().any(|path| path.exists()) {
            assert!(Instant::now() < deadline, "paused at the timeout, but its cgroup is still there");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // It stays paused (its clock stands still): not expired a few sweeps later.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(call(&server, "GET", &format!("/v1/sandboxes/{id}"), None).json["state"], "paused");
    let resumed = call(&server, "POST", &format!("/v1/sandboxes/{id}/resume"), None);
    assert_eq!(resumed.status, 200, "{resumed:?}");
    // Resumed after its timeout: it gets the server's default timeout again, not a second's sweep.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(server.exec(&id, "echo back").json["stdout"], "back\n");
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
    assert_eq!(paused.status, 200, "{paused:?}");
    if tier != Tier::Process {
        let image = saved_memory(tier, &id);
        assert!(image.is_dir(), "the paused sandbox's saved memory is at {}", image.display());
    }
    let spawners = serve::children_of(server.pid());
    // SAFETY: kill(2) of the spawner, a child of our child, which we just listed.
    unsafe { libc::kill(spawners[0] as libc::pid_t, libc::SIGKILL) };
    server.stop_with(libc::SIGKILL);
    server.relaunch();
    // The next spawner's gc removes the frozen cgroup and everything in it (gVisor: the checkpoint image, bundle and
    // runsc state); the restart marks the sandbox lost.
    serve::assert_sandbox_gone_on(tier, &id);
    assert_eq!(call(&server, "GET", &format!("/v1/sandboxes/{id}"), None).json["state"], "lost");
}

/// The gVisor and microVM branch of the first test: pause saves the sandbox's memory (a `runsc checkpoint`, QEMU's
/// migration to a file) and leaves nothing running on the host, and the resume continues the sandbox where it was.
fn a_released_sandbox_holds_nothing_on_the_host_and_resumes_where_it_was(server: &Server, tier: Tier, id: &str) {
    let base = format!("/v1/sandboxes/{id}");
    assert_eq!(server.exec(id, "echo kept > /workspace/before").status, 200);
    let code = |code: &str| {
        let reply = call(server, "POST", &format!("{base}/code"), Some(json!({"language": "python", "code": code})));
        assert_eq!(reply.status, 200, "{reply:?}");
        reply.json
    };
    let set =
        code("x = 41\nopened = open('/tmp/open.txt', 'w')\nopened.write('before-')\nopened.flush()\nprint('set')");
    assert_eq!(set["stdout"], "set\n", "{set}");
    let ticks = "for i in $(seq 1 40); do echo tick $i; sleep 0.1; done";
    let started = call(server, "POST", &format!("{base}/exec"), Some(json!({"cmd": ticks, "background": true})));
    assert_eq!(started.status, 202, "{started:?}");
    let command = started.json["command_id"].as_str().unwrap().to_owned();
    std::thread::sleep(Duration::from_millis(800));

    let before = Instant::now();
    let paused = call(server, "POST", &format!("{base}/pause"), None);
    assert_eq!((paused.status, paused.json["state"].as_str()), (200, Some("paused")), "{paused:?}");
    eprintln!("pause took {:?}", before.elapsed());
    let running: Vec<String> =
        common::host_pids().into_iter().map(common::cmdline).filter(|line| line.contains(id)).collect();
    assert!(running.is_empty(), "no host process of the paused sandbox runs: {running:?}");
    let cgroups: Vec<_> = common::cgroup_paths(id).into_iter().filter(|path| path.exists()).collect();
    assert!(cgroups.is_empty(), "the paused sandbox's cgroup is gone: {cgroups:?}");
    let image = saved_memory(tier, id);
    let mode = std::fs::metadata(&image).map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777);
    assert_eq!(mode.ok(), Some(0o700), "the checkpoint image {} is root's alone", image.display());
    let refused = call(server, "POST", &format!("{base}/exec"), Some(json!({"cmd": "true"})));
    assert_eq!((refused.status, refused.json["error"]["code"].as_str()), (409, Some("paused")), "{refused:?}");
    std::thread::sleep(Duration::from_millis(1000));

    let before = Instant::now();
    let resumed = call(server, "POST", &format!("{base}/resume"), None);
    assert_eq!((resumed.status, resumed.json["state"].as_str()), (200, Some("running")), "{resumed:?}");
    eprintln!("resume took {:?}", before.elapsed());
    assert!(!image.exists(), "the image is removed once the sandbox runs again");
    let answer = code("opened.write('after')\nopened.close()\nprint(open('/tmp/open.txt').read())\nx + 1");
    assert_eq!(answer["stdout"], "before-after\n", "the open file lived on: {answer}");
    assert_eq!(answer["results"][0]["text/plain"], "42", "the variable lived on: {answer}");
    assert_eq!(server.exec(id, "cat /workspace/before").json["stdout"], "kept\n");

    // The background command ran on after the resume, and its output came on the same stream, nothing lost.
    let deadline = Instant::now() + Duration::from_secs(20);
    let exited = loop {
        let list = call(server, "GET", &format!("{base}/commands"), None);
        let entry = list.json["commands"].as_array().unwrap().iter().find(|c| c["id"] == command.as_str()).cloned();
        let entry = entry.expect("the command is listed");
        if entry["state"] == "exited" {
            break entry;
        }
        assert!(Instant::now() < deadline, "the background command did not end after the resume: {entry}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(exited["exit_code"], 0, "{exited}");
    let expected: String = (1..=40).map(|i| format!("tick {i}\n")).collect();
    assert_eq!(stream_stdout(server, id, &command), expected);

    // A paused sandbox can be deleted, and nothing of it is left.
    assert_eq!(call(server, "POST", &format!("{base}/pause"), None).status, 200);
    assert_eq!(call(server, "DELETE", &base, None).status, 204);
    serve::assert_sandbox_gone_on(tier, id);
}

/// Where a paused sandbox of a tier that saves memory keeps it: gVisor's checkpoint image, a released microVM's
/// directory of QEMU's migration file.
fn saved_memory(tier: Tier, id: &str) -> std::path::PathBuf {
    match tier {
        Tier::Microvm => common::microvm::state_dir_of(id).join("paused"),
        _ => std::path::Path::new(common::GVISOR_CHECKPOINTS).join(id),
    }
}

/// The whole stdout of an ended background command, from its event stream.
fn stream_stdout(server: &Server, id: &str, command: &str) -> String {
    let mut response = server
        .http()
        .get(format!("{}/v1/sandboxes/{id}/commands/{command}/stream", server.url))
        .header("Authorization", format!("Bearer {KEY_1}"))
        .call()
        .unwrap();
    let text = response.body_mut().read_to_string().unwrap();
    text.split("\n\n")
        .filter(|block| block.lines().any(|line| line == "event: stdout"))
        .filter_map(|block| block.lines().find_map(|line| line.strip_prefix("data: ")))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .filter_map(|data| data["data"].as_str().map(str::to_owned))
        .collect()
}
