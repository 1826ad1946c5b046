//! Long-lived microVM sandboxes through a real `sandkasten serve`: created with `{"isolation": "microvm"}`, a
//! sandbox runs in a guest kernel of its own, keeps its files in `/workspace` between execs, takes and gives files
//! through the files API, and leaves nothing when deleted (record, cgroups, VMM process, `<state_dir>/microvm/ID`).
//! `kill -9` of the server while a microVM sandbox runs takes its VMM down with it, and the restarted server
//! collects the rest and says the sandbox is lost. A `[[pools]]` class with `isolation = "microvm"` boots VMs ahead:
//! a create claims the booted VM (its VMM was running before), it serves, the pool boots a replacement, and a
//! shutdown stops the pool's VMMs. A create answer says how long the guest's boot took (`vm_boot_ms`) and a
//! `/v1/run` result has the boot as its own phase. The sandbox's root cannot panic its guest kernel through
//! `/proc/sysrq-trigger` (landlock refuses the write; the VM serves on).
//!
//! The microvm tier is not in `Tier::AVAILABLE` yet: plain tests, each skipping when QEMU or the boot files are
//! missing. Each test boots one VM.

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::time::{Duration, Instant};

use common::microvm::{alive, assert_no_microvm_leaks, vmm_processes, wait_for_vmm};
use serde_json::{Value, json};
use serve::{KEY_1, Server};

/// Creates a microVM sandbox as t1; its id.
fn create_microvm(server: &Server) -> String {
    let reply = server.call("POST", "/v1/sandboxes", KEY_1, Some(json!({"isolation": "microvm"})));
    assert_eq!(reply.status, 201, "create of a microVM sandbox failed: {reply:?}");
    assert_eq!(reply.json["isolation"]["tier"], "microvm", "the sandbox is not a microVM: {reply:?}");
    assert_eq!(reply.json["isolation"]["reason"], "requested", "{reply:?}");
    // This host's KVM is emulated: `accel = "auto"` runs guests under software emulation, and says so.
    assert_eq!(reply.json["isolation"]["accel"], "tcg", "{reply:?}");
    // The guest's boot (QEMU's launch to the agent's greeting): seconds under TCG, never nothing.
    let boot_ms = reply.json["vm_boot_ms"].as_f64().unwrap_or_default();
    assert!((100.0..90_000.0).contains(&boot_ms), "vm_boot_ms of a fresh VM: {reply:?}");
    reply.json["id"].as_str().expect("id").to_owned()
}

#[test]
fn microvm_sandbox_keeps_its_files_between_execs_and_leaves_nothing_when_deleted() {
    require_microvm!();
    let server = Server::start();
    let id = create_microvm(&server);
    let vmm = wait_for_vmm(&id, Duration::from_secs(10));
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();

    let first = server.exec(&id, "echo 41 > /workspace/x; id -u; uname -r");
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.json["exit_code"], 0, "{first:?}");
    let stdout = first.json["stdout"].as_str().unwrap_or_default();
    let (uid, release) = stdout.split_once('\n').unwrap_or_else(|| panic!("{first:?}"));
    assert_eq!(uid, "1000", "{first:?}");
    assert_ne!(release.trim(), host_release.trim(), "the sandbox runs on the host's kernel: {first:?}");
    let second = server.exec(&id, "cat /workspace/x; exit 3");
    assert_eq!(second.json["stdout"], "41\n", "files persist between execs: {second:?}");
    assert_eq!(second.json["exit_code"], 3, "{second:?}");

    let bytes: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let put = server.put_bytes(&format!("/v1/sandboxes/{id}/files?path=/workspace/blob.bin"), KEY_1, &bytes);
    assert!(put.status == 204 || put.status == 200, "upload: {put:?}");
    let get = server.call("GET", &format!("/v1/sandboxes/{id}/files?path=/workspace/blob.bin"), KEY_1, None);
    assert_eq!(get.status, 200, "download: {get:?}");
    assert_eq!(get.body, bytes, "a file uploaded to the guest reads back identically");
    let size = server.exec(&id, "wc -c < /workspace/blob.bin");
    assert_eq!(size.json["stdout"], "300000\n", "the guest's program sees the uploaded file: {size:?}");
    assert!(alive(vmm), "the VMM {vmm} died while its sandbox lives");

    let deleted = server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert_eq!(deleted.status, 204, "{deleted:?}");
    assert_no_microvm_leaks(&id);
    assert!(!alive(vmm), "the VMM {vmm} outlived its deleted sandbox");
    let after = server.exec(&id, "true");
    assert!(after.status == 404 || after.status == 409, "exec on a deleted sandbox: {after:?}");

    // A one-shot run boots a VM of its own: its result has the boot as a phase of its own, after `allocate`.
    let run = server.call("POST", "/v1/run", KEY_1, Some(json!({"isolation": "microvm", "argv": ["echo", "hi"]})));
    assert_eq!(run.status, 200, "{run:?}");
    assert_eq!(run.json["stdout"], "hi\n", "{run:?}");
    assert_eq!(run.json["isolation"]["accel"], "tcg", "{run:?}");
    let phase = |name: &str| run.json["phases"][name].as_f64().unwrap_or(-1.0);
    assert!(phase("vm_boot") - phase("allocate") > 100.0, "the VM's boot is its own phase: {run:?}");
    assert!(phase("vm_boot") <= phase("filesystem_ready"), "{run:?}");
    let exec_phases = &second.json["phases"];
    assert_eq!(exec_phases["vm_boot"], 0.0, "an exec in a running VM boots nothing: {second:?}");
}

#[test]
fn kill_9_of_the_server_takes_its_vms_down_and_restart_leaves_nothing() {
    require_microvm!();
    // Exclusive: a crashed server's sandboxes are collected by the next spawner; no other run may take them first.
    let mut server = Server::start_exclusive();
    let id = create_microvm(&server);
    let vmm = wait_for_vmm(&id, Duration::from_secs(10));
    let busy = server.exec(&id, "echo ready");
    assert_eq!(busy.json["stdout"], "ready\n", "{busy:?}");

    server.stop_with(libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(20);
    while alive(vmm) || !vmm_processes(&id).is_empty() {
        assert!(Instant::now() < deadline, "the VMM {vmm} still runs 20 s after its server was killed");
        std::thread::sleep(Duration::from_millis(50));
    }

    server.relaunch();
    assert_no_microvm_leaks_within(&id, Duration::from_secs(20));
    let info = server.call("GET", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert_eq!(info.status, 200, "the record of {id} survived the crash: {info:?}");
    assert_eq!(info.json["state"], Value::from("lost"), "{info:?}");
}

/// Waits (up to `limit`) until the restarted server's collection has removed what the crash left of `id`.
fn assert_no_microvm_leaks_within(id: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !common::microvm::microvm_leftovers(id).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_no_microvm_leaks(id);
}

/// The number of ready members of pool `class`.
fn pool_size(server: &Server, class: &str) -> f64 {
    serve::metric(server, &format!("sandkasten_pool_size{{class=\"{class}\"}}"))
}

/// Waits (up to `limit`) until pool `class` holds `want` booted VMs.
fn wait_pool_size(server: &Server, class: &str, want: f64, limit: Duration) {
    let deadline = Instant::now() + limit;
    while pool_size(server, class) != want {
        assert!(Instant::now() < deadline, "the pool holds {} VMs, want {want}", pool_size(server, class));
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_microvm_pool_boots_ahead_and_a_claimed_vm_serves_and_is_replaced() {
    require_microvm!();
    let mut server = Server::start_with("[[pools]]\nname = \"vm\"\nisolation = \"microvm\"\nmin = 1\nmax = 1\n");
    wait_pool_size(&server, "vm", 1.0, Duration::from_secs(120));
    let pooled = server_vmms(&server);
    assert_eq!(pooled.len(), 1, "the pool holds a VM: one VMM of this server runs");

    let started = Instant::now();
    let id = create_microvm(&server);
    let claimed_in = started.elapsed();
    let vmm = wait_for_vmm(&id, Duration::from_secs(5));
    assert!(pooled.contains(&vmm), "the sandbox's VMM {vmm} is not one the pool booted ({pooled:?})");
    let answered = server.exec(&id, "echo served > /workspace/x; cat /workspace/x; uname -r");
    assert_eq!(answered.json["exit_code"], 0, "{answered:?}");
    assert!(answered.json["stdout"].as_str().unwrap_or_default().starts_with("served\n"), "{answered:?}");
    eprintln!("claimed a pooled microVM in {claimed_in:?}");
    // The pool boots a replacement; the claimed VM is the caller's alone and is removed when deleted.
    wait_pool_size(&server, "vm", 1.0, Duration::from_secs(120));
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    assert_no_microvm_leaks(&id);
    // Shutdown leaves no VMM of the pool behind.
    let replacements = server_vmms(&server);
    assert_eq!(replacements.len(), 1, "the pool's replacement: {replacements:?}");
    server.stop_with(libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(20);
    while replacements.iter().any(|pid| alive(*pid)) {
        assert!(Instant::now() < deadline, "the pool's VMM still runs after the server stopped: {replacements:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// This server's VMMs (its spawner's children that run QEMU).
fn server_vmms(server: &Server) -> Vec<u32> {
    serve::children_of(server.pid())
        .into_iter()
        .flat_map(serve::children_of)
        .filter(|pid| common::microvm::is_vmm(*pid))
        .collect()
}

/// `Authorization: Basic base64("root:")`: the E2B facade's `user="root"`, the only way to run a command as the
/// sandbox's root.
const AS_ROOT: &str = "Basic cm9vdDo=";

/// Starts `sh -c script` as the sandbox's root through the E2B facade's `process.Process/Start`; the raw stream.
fn start_as_root(server: &Server, id: &str, token: &str, script: &str) -> Result<Vec<u8>, String> {
    let message = json!({ "process": { "cmd": "/bin/sh", "args": ["-c", script] } }).to_string();
    let mut body = vec![0u8];
    body.extend_from_slice(&(message.len() as u32).to_be_bytes());
    body.extend_from_slice(message.as_bytes());
    let mut response = server
        .http()
        .post(format!("{}/process.Process/Start", server.url))
        .header("Content-Type", "application/connect+json")
        .header("Connect-Timeout-Ms", "60000")
        .header("E2b-Sandbox-Id", id)
        .header("X-Access-Token", token)
        .header("Authorization", AS_ROOT)
        .send(&body[..])
        .map_err(|e| e.to_string())?;
    response.body_mut().read_to_vec().map_err(|e| e.to_string())
}

/// The sandbox's root cannot panic its guest kernel: `/proc/sysrq-trigger` (root's, mode 0200) is refused to it
/// (the jail's landlock allows writes only to the sandbox's writable directories), the VMM lives on and the VM
/// serves the next command; deleting it leaves nothing.
#[test]
fn the_sandbox_root_cannot_panic_its_guest_kernel() {
    require_microvm!();
    let server = Server::start_with("[defaults]\nisolation = \"microvm\"\n");
    let mut created = server
        .http()
        .post(format!("{}/v2/sandboxes", server.url))
        .header("X-API-KEY", KEY_1)
        .send_json(json!({ "templateID": "base", "timeout": 300 }))
        .expect("create through the facade");
    let body: Value = created.body_mut().read_json().expect("create answer");
    let id = body["sandboxID"].as_str().expect("sandboxID").to_owned();
    let token = body["envdAccessToken"].as_str().expect("envdAccessToken").to_owned();
    let vmm = wait_for_vmm(&id, Duration::from_secs(10));
    let decoded = |stream: &[u8]| -> String {
        // The stream's messages carry stdout and stderr base64-encoded: decode each field found.
        let text = String::from_utf8_lossy(stream).into_owned();
        let mut out = String::new();
        for part in text.split('"').collect::<Vec<_>>().windows(3) {
            if (part[0] == "stdout" || part[0] == "stderr") && part[1] == ":" {
                use base64::Engine as _;
                let bytes = base64::engine::general_purpose::STANDARD.decode(part[2]).unwrap_or_default();
                out.push_str(&String::from_utf8_lossy(&bytes));
            }
        }
        out
    };
    let control = decoded(&start_as_root(&server, &id, &token, "id -u").expect("positive control"));
    assert_eq!(control, "0\n", "positive control: the sandbox's root runs commands");

    let attempt = start_as_root(&server, &id, &token, "echo c > /proc/sysrq-trigger; echo rc=$?").expect("attempt");
    let said = decoded(&attempt);
    assert!(said.contains("Permission denied") && said.contains("rc=2"), "sysrq-trigger was not refused: {said}");
    std::thread::sleep(Duration::from_secs(1));
    assert!(alive(vmm), "the VMM {vmm} died: the guest kernel panicked");
    let next = decoded(&start_as_root(&server, &id, &token, "echo still").expect("next command"));
    assert_eq!(next, "still\n", "the VM serves on");

    let deleted = server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert_eq!(deleted.status, 204, "{deleted:?}");
    assert_no_microvm_leaks_within(&id, Duration::from_secs(30));
}

/// A guest kernel that panics while a command runs (here: the guest's OOM killer under the operator's
/// `sysctl.vm.panic_on_oom=1`, a real panic started from inside the sandbox; an agent dying as the guest's PID 1
/// ends the same way) ends the sandbox: the command's answer and the sandbox's end reason carry the kernel's panic
/// line, the VMM is gone and nothing of the sandbox is left.
#[test]
fn a_guest_kernel_panic_ends_the_sandbox_with_the_panic_line_and_leaves_nothing() {
    require_microvm!();
    let server = Server::start_with("[microvm]\nkernel_args = [\"sysctl.vm.panic_on_oom=1\"]\n");
    let id = create_microvm(&server);
    let vmm = wait_for_vmm(&id, Duration::from_secs(5));
    let bomb = "/usr/bin/python3 -c 'a = []\nwhile True: a.append(bytearray(10**7))'";
    let answered = server.exec(&id, bomb);
    let message = answered.json["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(
        message.contains("the guest kernel panicked: Kernel panic - not syncing: Out of memory"),
        "the command's answer does not say the guest kernel panicked: {answered:?}"
    );
    let info = server.call("GET", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert_eq!(info.json["state"], Value::from("lost"), "{info:?}");
    assert!(
        info.json["end_reason"].as_str().is_some_and(|reason| reason.contains("Kernel panic - not syncing")),
        "the sandbox's end reason does not carry the panic: {info:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(vmm) {
        assert!(Instant::now() < deadline, "the VMM {vmm} of a panicked guest still runs");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_no_microvm_leaks(&id);
}

/// An operator's kernel parameter that keeps the guest from booting (`rdinit=` naming no file: the kernel falls back
/// to mounting a root it has none of, and panics before any userspace) fails the create with the kernel's panic
/// line, and leaves no sandbox and no VMM.
#[test]
fn a_guest_that_panics_at_boot_fails_the_create_with_the_panic_line_and_leaves_nothing() {
    require_microvm!();
    let server = Server::start_with("[microvm]\nkernel_args = [\"rdinit=/no-such-init\"]\n");
    let reply = server.call("POST", "/v1/sandboxes", KEY_1, Some(json!({"isolation": "microvm"})));
    assert!(reply.status >= 500, "a guest that cannot boot was created: {reply:?}");
    let message = reply.json["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("the guest kernel panicked: Kernel panic - not syncing: VFS: Unable to mount root fs"),
        "the create's error does not carry the panic line: {reply:?}"
    );
    let listed = server.call("GET", "/v1/sandboxes", KEY_1, None);
    let ids: Vec<String> = listed.json["sandboxes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|sandbox| sandbox["state"] == "running")
        .filter_map(|sandbox| sandbox["id"].as_str().map(str::to_owned))
        .collect();
    assert!(ids.is_empty(), "a failed create left a running sandbox: {listed:?}");
    assert!(server_vmms(&server).is_empty(), "a failed create left a VMM");
    for sandbox in listed.json["sandboxes"].as_array().into_iter().flatten() {
        assert_no_microvm_leaks(sandbox["id"].as_str().unwrap_or_default());
    }
}
