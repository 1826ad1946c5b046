//! A microVM sandbox's memory through a real `sandkasten serve` (#13 item 5). Paused in place (`[microvm]
//! release_paused = false`), its VMM (QEMU stopped, in the sandbox's frozen cgroup) gets no CPU, measured on the
//! host from the VMM's own CPU time and the cgroup's counter; resumed, the same guest process counts on; a paused
//! microVM is deleted leaving nothing; a running command's timeout does not count the pause (QMP `stop` stops the
//! guest's clocks). Paused with the VM released (the default), no VMM, cgroup or monitor is left while paused, and
//! the resume goes on from the saved memory. Memory snapshots restore and fork with the guest's processes running;
//! a server killed while it saves one leaves nothing its restart does not remove.
//!
//! The microvm tier is not in `Tier::AVAILABLE` yet: plain tests, each skipping when QEMU or the boot files are
//! missing. Each test boots one VM (and its restores), so keep them few.

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::time::{Duration, Instant};

use common::microvm::{alive, assert_no_microvm_leaks, wait_for_vmm};
use serde_json::{Value, json};
use serve::{KEY_1, Server};

/// The config of a server whose microVMs pause in place (QMP `stop` under the cgroup freeze).
const PAUSE_IN_PLACE: &str = "[microvm]\nrelease_paused = false\n";

/// Creates a microVM sandbox as t1 with `extra` fields; its id.
fn create_microvm(server: &Server, extra: Value) -> String {
    let mut body = json!({"isolation": "microvm", "timeout_s": 900, "limits": {"timeout_ms": 120_000}});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    let reply = server.call("POST", "/v1/sandboxes", KEY_1, Some(body));
    assert_eq!(reply.status, 201, "create of a microVM sandbox failed: {reply:?}");
    assert_eq!(reply.json["isolation"]["tier"], "microvm", "the sandbox is not a microVM: {reply:?}");
    reply.json["id"].as_str().expect("id").to_owned()
}

fn call(server: &Server, method: &str, path: &str, body: Option<Value>) -> serve::Reply {
    server.call(method, path, KEY_1, body)
}

/// CPU time (user + system, every thread) of a host process, in ms.
fn cpu_ms(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some(close) = stat.rfind(')') else { return 0 };
    let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|t| t.parse::<u64>().ok()).unwrap_or(0);
    (ticks(11) + ticks(12)) * 10
}

/// The sandbox cgroup's CPU counter (cgroup v1 `cpuacct.usage` or v2 `cpu.stat`), in ms, if there is one.
fn cgroup_cpu_ms(id: &str) -> Option<u64> {
    for path in common::cgroup_paths(id) {
        if let Ok(ns) = std::fs::read_to_string(path.join("cpuacct.usage")) {
            return ns.trim().parse::<u64>().ok().map(|ns| ns / 1_000_000);
        }
        if let Ok(stat) = std::fs::read_to_string(path.join("cpu.stat")) {
            let usec = stat.lines().find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse::<u64>().ok());
            return usec.map(|us| us / 1000);
        }
    }
    None
}

/// The guest counter's value (`/workspace/n`, written by the counting loop).
fn counter(server: &Server, id: &str) -> u64 {
    let read = server.exec(id, "cat /workspace/n");
    read.json["stdout"].as_str().unwrap_or_default().trim().parse().unwrap_or_else(|_| panic!("counter: {read:?}"))
}

/// Starts the guest's counting loop in the background and waits until it counts; the loop's guest pid.
fn start_counter(server: &Server, id: &str) -> String {
    let loop_cmd = "echo $$ > /workspace/pid; i=0; while :; do i=$((i+1)); echo $i > /workspace/n.tmp; \
                    mv /workspace/n.tmp /workspace/n; done";
    let started = call(
        server,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"cmd": loop_cmd, "background": true, "timeout_ms": 120_000})),
    );
    assert_eq!(started.status, 202, "{started:?}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let read = server.exec(id, "cat /workspace/n 2>/dev/null && cat /workspace/pid");
        let out = read.json["stdout"].as_str().unwrap_or_default().to_owned();
        if let Some((_, pid)) = out.split_once('\n') {
            return pid.trim().to_owned();
        }
        assert!(Instant::now() < deadline, "the guest's counter did not start: {read:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Pauses sandbox `id`, asserts its VMM and cgroup get no CPU for 8 s and requests answer 409, and resumes it.
fn pause_and_measure(server: &Server, id: &str, vmm: u32) {
    let base = format!("/v1/sandboxes/{id}");
    let paused = call(server, "POST", &format!("{base}/pause"), None);
    assert_eq!((paused.status, paused.json["state"].as_str()), (200, Some("paused")), "{paused:?}");
    std::thread::sleep(Duration::from_millis(300));
    let (vmm_before, cgroup_before) = (cpu_ms(vmm), cgroup_cpu_ms(id));
    std::thread::sleep(Duration::from_secs(8));
    let vmm_used = cpu_ms(vmm) - vmm_before;
    assert!(vmm_used <= 20, "the paused VMM used {vmm_used} ms of CPU in 8 s");
    if let (Some(before), Some(after)) = (cgroup_before, cgroup_cpu_ms(id)) {
        assert!(after - before <= 20, "the paused sandbox's cgroup used {} ms of CPU in 8 s", after - before);
    }
    assert!(alive(vmm), "the paused VMM {vmm} is gone");
    let refused = call(server, "POST", &format!("{base}/exec"), Some(json!({"cmd": "true"})));
    assert_eq!((refused.status, refused.json["error"]["code"].as_str()), (409, Some("paused")), "{refused:?}");
    let resumed = call(server, "POST", &format!("{base}/resume"), None);
    assert_eq!((resumed.status, resumed.json["state"].as_str()), (200, Some("running")), "{resumed:?}");
}

#[test]
fn a_paused_microvm_gets_no_cpu_and_its_processes_count_on_after_resume() {
    require_microvm!();
    let server = Server::start_with(PAUSE_IN_PLACE);
    let id = create_microvm(&server, json!({}));
    let base = format!("/v1/sandboxes/{id}");
    let vmm = wait_for_vmm(&id, Duration::from_secs(10));
    let pid = start_counter(&server, &id);
    pause_and_measure(&server, &id, vmm);
    let first = counter(&server, &id);
    std::thread::sleep(Duration::from_secs(1));
    let second = counter(&server, &id);
    assert!(second > first, "the counter does not count after the resume ({first} then {second})");
    let same = server.exec(&id, &format!("kill -0 {pid} && cat /workspace/pid"));
    assert_eq!(same.json["stdout"].as_str().map(str::trim), Some(pid.as_str()), "the same loop runs: {same:?}");

    // A paused microVM can be deleted, and nothing of it is left.
    assert_eq!(call(&server, "POST", &format!("{base}/pause"), None).status, 200);
    assert_eq!(call(&server, "DELETE", &base, None).status, 204);
    assert_no_microvm_leaks(&id);
}

// The pause is QMP `stop` (the guest's clocks stop with its vCPUs) under the cgroup freeze: a deadline the guest
// keeps cannot pass while the VM is paused, whenever the agent hears of the resume.
#[test]
fn a_commands_timeout_does_not_count_a_microvm_pause() {
    require_microvm!();
    let server = Server::start_with(PAUSE_IN_PLACE);
    let id = create_microvm(&server, json!({}));
    let base = format!("/v1/sandboxes/{id}");
    let vmm = wait_for_vmm(&id, Duration::from_secs(10));
    // A foreground command that runs across the pause: its 10 s timeout must not count the 8 s pause.
    std::thread::scope(|scope| {
        let waiting = scope.spawn(|| {
            let body = json!({"cmd": "sleep 5; echo survived", "timeout_ms": 10_000});
            call(&server, "POST", &format!("{base}/exec"), Some(body))
        });
        std::thread::sleep(Duration::from_secs(2));
        pause_and_measure(&server, &id, vmm);
        let waited = waiting.join().unwrap();
        assert_eq!(waited.status, 200, "{waited:?}");
        assert_eq!(
            (waited.json["stdout"].as_str(), waited.json["timed_out"].as_bool()),
            (Some("survived\n"), Some(false)),
            "the command's 10 s timeout counted the 8 s pause: {waited:?}"
        );
    });
    assert_eq!(call(&server, "DELETE", &base, None).status, 204);
    assert_no_microvm_leaks(&id);
}

/// The ids of a fork's answer.
fn forked_ids(reply: &serve::Reply) -> Vec<String> {
    reply.json["sandboxes"]
        .as_array()
        .expect("sandboxes")
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Files left in the server's memory-snapshot work directory.
fn work_files(server: &Server) -> Vec<std::path::PathBuf> {
    let work = server.database().parent().unwrap().join("snapshot-work");
    let mut found = Vec::new();
    let mut dirs = vec![work];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.path().is_dir() { dirs.push(entry.path()) } else { found.push(entry.path()) }
        }
    }
    found
}

#[test]
fn a_microvm_memory_snapshot_restores_and_forks_with_its_running_processes_through_the_api() {
    require_microvm!();
    let server = Server::start();
    let source = create_microvm(&server, json!({}));
    let pid = start_counter(&server, &source);
    assert_eq!(server.exec(&source, "echo kept > /workspace/kept").json["exit_code"], 0);

    let taken = call(&server, "POST", &format!("/v1/sandboxes/{source}/snapshots"), Some(json!({"memory": true})));
    assert_eq!((taken.status, taken.json["memory"].as_bool()), (201, Some(true)), "{taken:?}");
    let snapshot = taken.json["snapshot_id"].as_str().unwrap().to_owned();
    let before = counter(&server, &source);
    std::thread::sleep(Duration::from_millis(500));
    assert!(counter(&server, &source) > before, "the source stopped counting after its snapshot");

    // A restore: the source's loop, from where it was, with its disk.
    let restored = call(&server, "POST", "/v1/sandboxes", Some(json!({"snapshot": snapshot})));
    assert_eq!((restored.status, restored.json["isolation"]["tier"].as_str()), (201, Some("microvm")), "{restored:?}");
    let copy = restored.json["id"].as_str().unwrap().to_owned();
    let same = server.exec(&copy, &format!("kill -0 {pid} && cat /workspace/pid /workspace/kept"));
    assert_eq!(same.json["stdout"].as_str(), Some(format!("{pid}\nkept\n").as_str()), "{same:?}");
    let at_restore = counter(&server, &copy);
    std::thread::sleep(Duration::from_millis(500));
    assert!(counter(&server, &copy) > at_restore, "the restored loop does not count");
    assert_eq!(call(&server, "DELETE", &format!("/v1/sandboxes/{copy}"), None).status, 204);
    assert_no_microvm_leaks(&copy);

    // A fork: two copies from one snapshot, each going on, sharing nothing.
    let forked = call(&server, "POST", &format!("/v1/sandboxes/{source}/fork"), Some(json!({"count": 2})));
    assert_eq!(forked.status, 201, "{forked:?}");
    let copies = forked_ids(&forked);
    assert_eq!(copies.len(), 2, "{forked:?}");
    for copy in &copies {
        let runs = server.exec(copy, &format!("kill -0 {pid} && echo runs"));
        assert_eq!(runs.json["stdout"], "runs\n", "the source's loop is not running in {copy}: {runs:?}");
    }
    assert_eq!(server.exec(&copies[0], "echo mine > /workspace/only-first").json["exit_code"], 0);
    for other in [&copies[1], &source] {
        let seen = server.exec(other, "cat /workspace/only-first 2>/dev/null || echo absent");
        assert_eq!(seen.json["stdout"], "absent\n", "{other} sees a file written in {}", copies[0]);
    }
    for id in copies.iter().chain([&source]) {
        assert_eq!(call(&server, "DELETE", &format!("/v1/sandboxes/{id}"), None).status, 204);
        assert_no_microvm_leaks(id);
    }
    assert_eq!(call(&server, "DELETE", &format!("/v1/snapshots/{snapshot}"), None).status, 204);
    assert_eq!(work_files(&server), Vec::<std::path::PathBuf>::new(), "a memory image was left on the host");
}

#[test]
fn a_microvm_paused_with_memory_is_released_and_resumes_where_it_was() {
    require_microvm!();
    let server = Server::start();
    let id = create_microvm(&server, json!({}));
    let base = format!("/v1/sandboxes/{id}");
    let vmm = wait_for_vmm(&id, Duration::from_secs(10));
    let pid = start_counter(&server, &id);
    // A foreground command across the pause: its 20 s timeout counts the guest's time only.
    std::thread::scope(|scope| {
        let waiting = scope.spawn(|| {
            let body = json!({"cmd": "sleep 4; echo survived", "timeout_ms": 20_000});
            call(&server, "POST", &format!("{base}/exec"), Some(body))
        });
        std::thread::sleep(Duration::from_secs(2));
        let paused = call(&server, "POST", &format!("{base}/pause"), None);
        assert_eq!((paused.status, paused.json["pause_mode"].as_str()), (200, Some("memory")), "{paused:?}");
        // Released: no VMM, no cgroup, no monitor socket; the saved memory is in the sandbox's own directory.
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(vmm) {
            assert!(Instant::now() < deadline, "the VMM {vmm} of a released microVM still runs");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(common::microvm::vmm_processes(&id).is_empty(), "a VMM runs for a released microVM");
        assert!(common::cgroup_paths(&id).iter().all(|path| !path.exists()), "the released microVM kept its cgroup");
        let dir = common::microvm::state_dir_of(&id);
        assert!(!dir.join("qmp.sock").exists() && dir.join("paused/vm.qemu").is_file(), "{}", dir.display());
        std::thread::sleep(Duration::from_secs(20));
        let refused = call(&server, "POST", &format!("{base}/exec"), Some(json!({"cmd": "true"})));
        assert_eq!(refused.status, 409, "{refused:?}");
        let resumed = call(&server, "POST", &format!("{base}/resume"), None);
        assert_eq!((resumed.status, resumed.json["state"].as_str()), (200, Some("running")), "{resumed:?}");
        let waited = waiting.join().unwrap();
        assert_eq!(
            (waited.json["stdout"].as_str(), waited.json["timed_out"].as_bool()),
            (Some("survived\n"), Some(false)),
            "the command across a 20 s release did not go on: {waited:?}"
        );
    });
    let new_vmm = wait_for_vmm(&id, Duration::from_secs(10));
    assert_ne!(new_vmm, vmm, "the resume started a VMM of its own");
    assert!(!common::microvm::state_dir_of(&id).join("paused").exists(), "the saved memory outlived the resume");
    let first = counter(&server, &id);
    std::thread::sleep(Duration::from_secs(1));
    assert!(counter(&server, &id) > first, "the counter does not count after the resume");
    let same = server.exec(&id, &format!("kill -0 {pid} && cat /workspace/pid"));
    assert_eq!(same.json["stdout"].as_str().map(str::trim), Some(pid.as_str()), "the same loop runs: {same:?}");

    // Released again, then deleted: nothing is left.
    assert_eq!(call(&server, "POST", &format!("{base}/pause"), None).status, 200);
    assert_eq!(call(&server, "DELETE", &base, None).status, 204);
    assert_no_microvm_leaks(&id);
}

#[test]
fn kill_9_of_the_server_during_a_microvm_memory_snapshot_leaves_nothing_a_restart_does_not_clean() {
    require_microvm!();
    // Exclusive: a crashed server's sandboxes are collected by the next spawner; no other run may take them first.
    let mut server = Server::start_exclusive();
    let limits = json!({"memory_bytes": 512 << 20, "disk_bytes": 512 << 20, "timeout_ms": 120_000});
    let id = create_microvm(&server, json!({"limits": limits}));
    // Random bytes in the guest's page cache and on its disk (nothing for the stream or the disk copy to skip), so
    // the save and its upload take a while.
    let filled = server.exec(&id, "head -c 150M /dev/urandom > /workspace/fill && echo filled");
    assert_eq!(filled.json["stdout"], "filled\n", "{filled:?}");
    let vmm = wait_for_vmm(&id, Duration::from_secs(10));
    let url = format!("{}/v1/sandboxes/{id}/snapshots", server.url);
    let agent = server.http().clone();
    let taking = std::thread::spawn(move || {
        agent
            .post(&url)
            .header("Authorization", format!("Bearer {KEY_1}"))
            .send_json(json!({"memory": true}))
            .map(|r| r.status())
    });
    // Kill while the memory file is being written or uploaded.
    let deadline = Instant::now() + Duration::from_secs(60);
    while work_files(&server).is_empty() {
        assert!(Instant::now() < deadline, "the memory snapshot never wrote its file");
        std::thread::sleep(Duration::from_millis(5));
    }
    server.stop_with(libc::SIGKILL);
    let answered = taking.join().unwrap();
    assert!(answered.is_err(), "the snapshot finished before the kill, so this test proved nothing: {answered:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while alive(vmm) {
        assert!(Instant::now() < deadline, "the VMM {vmm} still runs 20 s after its server was killed");
        std::thread::sleep(Duration::from_millis(50));
    }

    server.relaunch();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !common::microvm::microvm_leftovers(&id).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_no_microvm_leaks(&id);
    assert_eq!(work_files(&server), Vec::<std::path::PathBuf>::new(), "the half-saved memory outlived the restart");
    let listed = call(&server, "GET", "/v1/snapshots", None);
    assert_eq!(listed.json["snapshots"], json!([]), "a half-taken snapshot is listed: {listed:?}");
}
