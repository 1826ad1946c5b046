//! The egress proxy cannot be made to exhaust the server's file descriptors: against a real `sandkasten serve`,
//! several sandboxes each open many more CONNECT tunnels than their cap to a host listener that accepts and holds
//! them (two server descriptors per tunnel: the sandbox's end and the upstream's). The proxy holds at most
//! `max_connections` per sandbox and `max_total_connections` of all together (the rest wait in their sandbox's
//! backlog, in the kernel); the listener sees no more, the server's descriptors grow by about two per held tunnel,
//! and `/healthz` and a new sandbox's exec still answer meanwhile.
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use common::Tier;
use sandkasten_runtime::MAX_HOST_DOOR_STREAMS;
use serve::{KEY_1, Server, assert_sandbox_gone_on};

per_tier!(sandboxes_past_their_proxy_cap_cannot_exhaust_the_servers_descriptors,);

/// Tunnels one sandbox's proxy connections may hold at once.
const PER_SANDBOX: usize = 24;
/// Tunnels all sandboxes together may hold at once.
const TOTAL: usize = 48;
/// Sandboxes attacking together, each opening `ATTEMPTS` tunnels.
const SANDBOXES: usize = 3;
const ATTEMPTS: usize = 100;

fn descriptors_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// A host listener that accepts every connection and holds it (the upstream the tunnels reach): counts them.
fn holding_listener() -> (u16, Arc<Mutex<Vec<TcpStream>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&held);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            sink.lock().unwrap().push(stream);
        }
    });
    (port, held)
}

/// Python that opens `ATTEMPTS` CONNECT tunnels through the proxy to `sink.test:PORT` without waiting in between,
/// then counts those the proxy answered `200` within a few seconds, writes the count to `/tmp/tunnels` and holds
/// every tunnel.
fn tunnels_code(port: u16) -> String {
    format!(
        "import socket, time\n\
        held = []\n\
        for i in range({ATTEMPTS}):\n\
        \x20   s = socket.socket(); s.settimeout(0.5)\n\
        \x20   try:\n\
        \x20       s.connect(('127.0.0.1', 3128))\n\
        \x20       s.sendall(b'CONNECT sink.test:{port} HTTP/1.1\\r\\nHost: sink.test:{port}\\r\\n\\r\\n')\n\
        \x20   except OSError:\n\
        \x20       pass\n\
        \x20   held.append(s)\n\
        deadline = time.time() + 5; up = 0\n\
        for s in held:\n\
        \x20   s.settimeout(max(0.05, deadline - time.time()))\n\
        \x20   try:\n\
        \x20       up += s.recv(64).startswith(b'HTTP/1.1 200')\n\
        \x20   except OSError:\n\
        \x20       pass\n\
        open('/tmp/tunnels', 'w').write('tunnels %d' % up)\n\
        time.sleep(60)\n"
    )
}

fn sandboxes_past_their_proxy_cap_cannot_exhaust_the_servers_descriptors(tier: Tier) {
    let (port, held) = holding_listener();
    // The test's listener is on the host's loopback: the operator names that very address for the test.
    let server = Server::start_with_on(
        tier,
        &format!(
            "[egress]\nhosts = {{ \"sink.test\" = [\"127.0.0.1\"] }}\nallow_cidrs = [\"127.0.0.1/32\"]\n\
             max_connections = {PER_SANDBOX}\nmax_total_connections = {TOTAL}\nmax_tenant_connections = {TOTAL}\n"
        ),
    );
    let policy = json!({"network": {"mode": "allowlist", "allow": ["sink.test"]}, "limits": {"timeout_ms": 120_000}});
    let ids: Vec<String> = (0..SANDBOXES).map(|_| server.create_on(tier, policy.clone())).collect();
    let bystander = server.create_on(tier, json!({}));
    let before = descriptors_of(server.pid());
    for id in &ids {
        let body = json!({"cmd": "/usr/bin/python3 -c \"$CODE\"", "env": {"CODE": tunnels_code(port)},
                          "background": true, "timeout_ms": 100_000});
        let reply = server.call("POST", &format!("/v1/sandboxes/{id}/exec"), KEY_1, Some(body));
        assert_eq!(reply.status, 202, "{reply:?}");
    }
    // Wait until every sandbox has counted its tunnels.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut counts = Vec::new();
    for id in &ids {
        loop {
            let reply = server.exec(id, "cat /tmp/tunnels 2>/dev/null");
            let stdout = reply.json["stdout"].as_str().unwrap_or_default().to_owned();
            if let Some(n) = stdout.split_whitespace().nth(1).and_then(|n| n.parse::<usize>().ok()) {
                counts.push(n);
                break;
            }
            assert!(Instant::now() < deadline, "sandbox {id} never counted its tunnels: {reply:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let upstream = held.lock().unwrap().len();
    let during = descriptors_of(server.pid());
    eprintln!("{tier}: tunnels per sandbox {counts:?}, upstream accepted {upstream}, server fds {before} -> {during}");
    // The attack ran: the proxy gave tunnels, up to the caps.
    assert!(counts.iter().sum::<usize>() > 0 && upstream > 0, "no tunnel was opened at all: nothing proven");
    assert!(counts.iter().all(|n| *n <= PER_SANDBOX), "a sandbox held more than {PER_SANDBOX} tunnels: {counts:?}");
    assert!(counts.iter().sum::<usize>() <= TOTAL, "sandboxes together held more than {TOTAL}: {counts:?}");
    assert!(upstream <= TOTAL, "the upstream got {upstream} connections, more than {TOTAL}");
    // Two descriptors per held tunnel, and a few for the sandboxes' doors; 600 were asked for. A microVM's door
    // streams wait for the proxy on the host, one descriptor each, at most `MAX_HOST_DOOR_STREAMS` per sandbox (the
    // other tiers' wait in the sandbox's own listen backlog).
    let waiting = if tier == Tier::Microvm { SANDBOXES * MAX_HOST_DOOR_STREAMS } else { 0 };
    assert!(during <= before + 2 * TOTAL + waiting + 32, "the server holds {during} descriptors (before: {before})");
    // The server still serves: its health, and a sandbox that is not attacking.
    let health = server.call("GET", "/healthz", KEY_1, None);
    assert_eq!(health.status, 200, "{health:?}");
    assert_eq!(server.exec(&bystander, "echo alive").json["stdout"], "alive\n");
    for id in ids.iter().chain([&bystander]) {
        assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
        assert_sandbox_gone_on(tier, id);
    }
    // Their tunnels are gone with them: the server's descriptors come back.
    let deadline = Instant::now() + Duration::from_secs(20);
    while descriptors_of(server.pid()) > before + 8 {
        assert!(Instant::now() < deadline, "the server still holds {} descriptors", descriptors_of(server.pid()));
        std::thread::sleep(Duration::from_millis(100));
    }
}
