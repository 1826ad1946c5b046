//! Egress from microVM sandboxes, attacked and checked from the host: the guest has no network device at all, and
//! its only way out is the door (the agent's `127.0.0.1:3128`, carried over the `sandkasten.door` virtio-serial
//! port to the host, which connects each stream to the egress proxy). With a policy allowing one test host the
//! guest reaches it; another host, the metadata address and the host's own addresses are refused and audited, and
//! the test hosts' own logs and a host listener confirm nothing reached them. Deleting the sandbox, and `kill -9` of
//! the server, leave no door socket, listener or thread.
//!
//! The microvm tier is not in `Tier::AVAILABLE` yet: plain tests, each skipping when QEMU or the boot files are
//! missing. Each test boots one VM.

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod egress;
mod serve;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::accepted_within;
use common::microvm::{assert_no_microvm_leaks, microvm_leftovers, state_dir_of};
use egress::World;
use serde_json::json;
use serve::KEY_1;

fn allowlist(hosts: &[&str]) -> serde_json::Value {
    json!({ "mode": "allowlist", "allow": hosts })
}

/// `curl` through the sandbox's proxy settings: prints the HTTP status, then the body.
fn curl(url: &str) -> String {
    format!("curl -sS -m 20 -w '\\nSTATUS %{{http_code}}\\n' '{url}'")
}

/// A microVM sandbox of t1 with `network`.
fn microvm_sandbox(world: &World, network: serde_json::Value) -> String {
    let reply =
        world.server.call("POST", "/v1/sandboxes", KEY_1, Some(json!({"isolation": "microvm", "network": network})));
    assert_eq!(reply.status, 201, "create of a microVM sandbox with a policy failed: {reply:?}");
    reply.json["id"].as_str().expect("id").to_owned()
}

/// The network interfaces the guest kernel has.
fn guest_interfaces(world: &World, id: &str) -> String {
    let (code, out, err) = world.sh(id, "ls /sys/class/net");
    assert_eq!(code, 0, "{out}{err}");
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether the host listens at the sandbox's door socket (a listening unix socket at `microvm/ID/door.sock`).
fn door_listening(id: &str) -> bool {
    let path = state_dir_of(id).join("door.sock");
    let table = std::fs::read_to_string("/proc/net/unix").unwrap();
    table.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(7) == Some(&path.to_str().unwrap()) && fields[3] == "00010000"
    })
}

/// How many of the server's threads serve microVM doors (`vm-door-*`, `door-*`).
fn door_threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .filter(|task| {
                    std::fs::read_to_string(task.path().join("comm"))
                        .is_ok_and(|comm| comm.starts_with("vm-door") || comm.starts_with("door-"))
                })
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn the_guest_reaches_its_allowed_host_only_through_the_door_and_everything_else_is_refused_and_audited() {
    require_microvm!();
    let world = World::start("");
    // A service of the host on its loopback and one on its end of allowed.test's veth (inside the allowed range).
    let loopback = TcpListener::bind("127.0.0.1:0").unwrap();
    let own = TcpListener::bind("10.201.0.1:0").unwrap();
    for listener in [&loopback, &own] {
        listener.set_nonblocking(true).unwrap();
        let probe = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        assert_eq!(accepted_within(listener, Duration::from_millis(200)), 1, "positive control");
        drop(probe);
    }
    let (loopback_port, own_port) = (loopback.local_addr().unwrap().port(), own.local_addr().unwrap().port());
    let id = microvm_sandbox(&world, allowlist(&["allowed.test"]));
    assert_eq!(guest_interfaces(&world, &id), "lo", "the guest has a network device");

    let (code, out, err) = world.sh(&id, &curl("http://allowed.test/whoami"));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("hello from allowed.test") && out.contains("STATUS 200"), "{out}{err}");
    assert!(world.allowed.requests().contains("/whoami"), "allowed.test did not see the request");

    let (_, out, err) = world.sh(&id, &curl("http://other.test/whoami"));
    assert!(out.contains("STATUS 403") && out.contains("not in the allowlist"), "{out}{err}");
    for target in
        ["169.254.169.254/latest".to_owned(), format!("127.0.0.1:{loopback_port}/"), format!("10.201.0.1:{own_port}/")]
    {
        let explicit = format!(
            "curl -sS -m 20 -x http://127.0.0.1:3128 --noproxy '' -w '\\nSTATUS %{{http_code}}\\n' 'http://{target}'"
        );
        let (_, out, err) = world.sh(&id, &explicit);
        assert!(out.contains("STATUS 403"), "{target}: {out}{err}");
    }
    // Past the proxy, by address: the guest has no route anywhere.
    let direct = "/usr/bin/python3 -c \"import socket\nfor target in [('10.201.0.2', 80), ('169.254.169.254', 80), ('10.201.0.6', 80)]:\n    \
         s = socket.socket(); s.settimeout(2)\n    try:\n        s.connect(target); print('CONNECTED', target)\n    \
         except OSError as e: print('failed', target, e.errno)\"";
    let (_, out, err) = world.sh(&id, direct);
    assert_eq!(out.matches("failed").count(), 3, "{out}{err}");

    assert_eq!(world.other.requests(), "", "other.test was reached");
    assert_eq!(world.metadata.requests(), "", "the metadata server was reached");
    assert_eq!(accepted_within(&loopback, Duration::from_millis(300)), 0, "the host's loopback service was reached");
    assert_eq!(accepted_within(&own, Duration::from_millis(300)), 0, "the host's own address was reached");
    let events = world.audit(&id, 5);
    let text = serde_json::to_string(&events).unwrap();
    assert!(text.contains("allowed.test") && text.contains("other.test"), "audit: {text}");
    assert!(text.contains("169.254.169.254") && text.contains("10.201.0.1"), "audit: {text}");
    assert!(events.len() >= 5, "every attempt is audited: {text}");

    assert_eq!(world.server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    assert_no_microvm_leaks(&id);
    assert!(!door_listening(&id), "the door's listener outlived its sandbox");
}

#[test]
fn kill_9_of_the_server_with_an_open_door_leaves_no_door_behind() {
    require_microvm!();
    let mut world = World::start("");
    let id = microvm_sandbox(&world, allowlist(&["allowed.test"]));
    let (_, out, err) = world.sh(&id, &curl("http://allowed.test/whoami"));
    assert!(out.contains("STATUS 200"), "positive control: {out}{err}");
    assert!(door_listening(&id), "positive control: the door listens");
    world.server.stop_with(libc::SIGKILL);
    world.server.relaunch();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !microvm_leftovers(&id).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_no_microvm_leaks(&id);
    assert!(!door_listening(&id), "a door listener survived the crash");
    assert!(!state_dir_of(&id).join("door.sock").exists(), "the door socket survived the crash");
    assert_eq!(door_threads(world.server.pid()), 0, "the restarted server serves a door");
}
