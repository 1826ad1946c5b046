//! Output a sandbox makes the server hold is bounded where it is held, on every tier, against a real `sandkasten
//! serve` (#11, item 1). The attacks run for real inside a sandbox and the assertions are on the server process:
//! - four background floods of 600 MB with the largest `output_bytes` leave the server's peak memory near where
//!   it was (the sandbox's retained output is capped at `max_retained_output_bytes`: 64 MiB by default, 4 MiB here
//!   so that the debug build the tests run pumps little);
//! - a writer that writes forever past its cap costs the server no CPU (the agent discards the stream inside the
//!   sandbox);
//! - a foreground exec of 300 MB of NUL bytes answers at most the budget in base64 (no `\u0000` escapes), marked
//!   truncated with `limit: output`.
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
    background_floods_do_not_grow_the_server_past_the_sandbox_budget,
    a_writer_past_its_cap_costs_the_server_no_cpu,
    a_binary_flood_answers_compactly_within_the_budget,
);

/// The servers' `max_retained_output_bytes`.
const BUDGET: u64 = 4 << 20;

fn server_on(tier: Tier) -> Server {
    Server::start_with_settings_on(tier, &format!("max_retained_output_bytes = {BUDGET}"))
}

/// A field of `/proc/PID/status` in KiB (`VmHWM`, `VmRSS`).
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field}"));
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap()
}

/// CPU time (user + system, all threads) the process has used, in clock ticks (1/100 s).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the state (field 3).
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn start_background(server: &Server, id: &str, body: Value) -> String {
    let mut body = body;
    body["background"] = json!(true);
    let reply = server.call("POST", &format!("/v1/sandboxes/{id}/exec"), KEY_1, Some(body));
    assert_eq!(reply.status, 202, "{reply:?}");
    reply.json["command_id"].as_str().unwrap().to_owned()
}

fn commands(server: &Server, id: &str) -> Vec<Value> {
    let list = server.call("GET", &format!("/v1/sandboxes/{id}/commands"), KEY_1, None);
    assert_eq!(list.status, 200, "{list:?}");
    list.json["commands"].as_array().unwrap().clone()
}

fn background_floods_do_not_grow_the_server_past_the_sandbox_budget(tier: Tier) {
    let server = server_on(tier);
    let limits = json!({"memory_bytes": common::small_memory(tier, 64 << 20), "output_bytes": 1u64 << 30, "timeout_ms": 120_000});
    let id = server.create_on(tier, json!({"limits": limits}));
    let before_kib = status_kib(server.pid(), "VmHWM");
    for _ in 0..4 {
        start_background(&server, &id, json!({"cmd": "head -c 600M /dev/zero"}));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let list = loop {
        let list = commands(&server, &id);
        if list.iter().all(|c| c["state"] == "exited") {
            break list;
        }
        assert!(Instant::now() < deadline, "the floods did not end: {list:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let grown_mib = status_kib(server.pid(), "VmHWM").saturating_sub(before_kib) >> 10;
    assert!(
        grown_mib < 64,
        "4 × 600 MB of output grew the server's peak memory by {grown_mib} MiB (budget {} MiB)",
        BUDGET >> 20
    );
    assert!(list.iter().all(|c| c["stdout_truncated"] == true), "every flood was cut: {list:?}");
    // What is retained, all commands together, is within the budget.
    let mut retained = 0u64;
    for command in &list {
        let path = format!("/v1/sandboxes/{id}/commands/{}/stream", command["id"].as_str().unwrap());
        let reply = server.call("GET", &path, KEY_1, None);
        assert_eq!(reply.status, 200, "{path}");
        let text = String::from_utf8_lossy(&reply.body).into_owned();
        retained += text
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .filter_map(|data| serde_json::from_str::<Value>(data).ok())
            .filter_map(|event| event["base64"].as_str().map(common::base64_decode))
            .map(|bytes| bytes.len() as u64)
            .sum::<u64>();
    }
    assert!(retained > 0 && retained <= BUDGET, "{retained} bytes retained for a budget of {BUDGET}");
    let reply = server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert_eq!(reply.status, 204, "{reply:?}");
}

fn a_writer_past_its_cap_costs_the_server_no_cpu(tier: Tier) {
    let server = server_on(tier);
    let id = server.create_on(tier, json!({"limits": {"output_bytes": 65536}}));
    // Writes forever (ignoring EPIPE too): its stream is cut at the cap and it keeps writing into nothing.
    let endless = "import os, signal\nsignal.signal(signal.SIGPIPE, signal.SIG_IGN)\nblock = b'x' * 65536\n\
                   os.write(2, b'started\\n')\nwhile True:\n    try:\n        os.write(1, block)\n    except OSError:\n        pass\n";
    let command = start_background(&server, &id, json!({"argv": ["/usr/bin/python3", "-c", endless]}));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list = commands(&server, &id);
        let entry = list.iter().find(|c| c["id"] == command.as_str()).unwrap();
        assert_eq!(entry["state"], "running", "the writer should keep running: {entry}");
        if entry["stdout_truncated"] == true {
            break;
        }
        assert!(Instant::now() < deadline, "the writer never passed its cap: {entry}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Let whatever was in flight drain, then measure the server over two seconds while the writer goes on.
    std::thread::sleep(Duration::from_millis(500));
    let (ticks, started) = (cpu_ticks(server.pid()), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let used_ms = (cpu_ticks(server.pid()) - ticks) * 10;
    let window_ms = started.elapsed().as_millis() as u64;
    let list = commands(&server, &id);
    assert!(list.iter().any(|c| c["id"] == command.as_str() && c["state"] == "running"), "{list:?}");
    assert!(
        used_ms * 20 <= window_ms,
        "the server spent {used_ms} ms of CPU in {window_ms} ms on output past the cap (more than 5 %)"
    );
}

fn a_binary_flood_answers_compactly_within_the_budget(tier: Tier) {
    let server = server_on(tier);
    let limits = json!({"memory_bytes": common::small_memory(tier, 64 << 20), "output_bytes": 1u64 << 30, "timeout_ms": 120_000});
    let id = server.create_on(tier, json!({"limits": limits}));
    let small = server.call("POST", &format!("/v1/sandboxes/{id}/exec"), KEY_1, Some(json!({"cmd": "printf 'a\\0b'"})));
    assert_eq!((small.json["stdout"].as_str(), small.json["stdout_base64"].as_str()), (Some(""), Some("YQBi")));

    let before_kib = status_kib(server.pid(), "VmHWM");
    let body = json!({"cmd": "head -c 300M /dev/zero", "timeout_ms": 120_000});
    let flood = server.call("POST", &format!("/v1/sandboxes/{id}/exec"), KEY_1, Some(body));
    assert_eq!(flood.status, 200, "{}", String::from_utf8_lossy(&flood.body[..flood.body.len().min(400)]));
    let answered = flood.body.len() as u64;
    assert!(answered <= BUDGET / 3 * 4 + (64 << 10), "a 300 MB NUL flood answered {answered} bytes");
    assert_eq!(flood.json["stdout"].as_str(), Some(""), "binary output is not spelled out as text");
    let kept = common::base64_decode(flood.json["stdout_base64"].as_str().unwrap());
    assert!(!kept.is_empty() && kept.len() as u64 <= BUDGET && kept.iter().all(|&b| b == 0), "{} bytes", kept.len());
    assert_eq!((flood.json["stdout_truncated"].as_bool(), flood.json["limit"].as_str()), (Some(true), Some("output")));
    let grown_mib = status_kib(server.pid(), "VmHWM").saturating_sub(before_kib) >> 10;
    assert!(grown_mib < 64, "a 300 MB flood grew the server's peak memory by {grown_mib} MiB");
}
