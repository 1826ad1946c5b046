//! Every exec result carries the same fields, on every tier, against a real `sandkasten serve`: a live exec's answer,
//! its stream's `exit` event, a background command's `exit` event and list entry, and `POST /v1/run` all say the exit
//! code or signal, `timed_out`, `oom_killed`, which `limit` fired, `usage` and `phases` — and they say it truly: a
//! memory bomb is `oom_killed` with `limit: memory`, a flood is `limit: output`, a sleep is `limit: time`, and the
//! phases are in order with the program's start before its first output.
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
    a_live_exec_says_which_limit_fired_what_it_used_and_its_phases,
    a_background_command_and_a_run_carry_the_same_fields,
);

const MEMORY_BOMB: &str = "a = []\nwhile True:\n    a.append(bytearray(8 << 20))\n";

/// The phases, in order, with the program's start after the request and its first output no later than the end.
fn assert_phases(answer: &Value, what: &str) -> [f64; 4] {
    let phase = |name: &str| answer["phases"][name].as_f64().unwrap_or_else(|| panic!("{what}: no {name}: {answer}"));
    let phases = ["allocate", "filesystem_ready", "runtime_ready", "first_command"].map(phase);
    assert!(phases.windows(2).all(|w| w[0] <= w[1]), "{what}: phases out of order: {answer}");
    assert!(phases[2] > 0.0, "{what}: the program's start was not measured: {answer}");
    let end = answer["duration_ms"].as_f64().unwrap_or(-1.0);
    assert!(phases[3] <= end + 1.0, "{what}: first output after the end: {answer}");
    phases
}

fn exec(server: &Server, id: &str, body: Value) -> Value {
    let reply = server.call("POST", &format!("/v1/sandboxes/{id}/exec"), KEY_1, Some(body));
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.json
}

fn a_live_exec_says_which_limit_fired_what_it_used_and_its_phases(tier: Tier) {
    let server = Server::start_on(tier);
    let limits = json!({"memory_bytes": common::small_memory(tier, 96 << 20), "output_bytes": 4096});
    let id = server.create_on(tier, json!({"limits": limits}));

    let plain = exec(&server, &id, json!({"argv": ["/usr/bin/python3", "-c", "print(sum(range(10**6)))"]}));
    assert_eq!((plain["exit_code"].as_i64(), plain["stdout"].as_str()), (Some(0), Some("499999500000\n")), "{plain}");
    assert_eq!((plain["oom_killed"].as_bool(), plain["limit"].clone()), (Some(false), Value::Null), "{plain}");
    let cpu =
        plain["usage"]["cpu_user_ms"].as_u64().unwrap_or(0) + plain["usage"]["cpu_system_ms"].as_u64().unwrap_or(0);
    assert!(cpu > 0, "the interpreter's CPU time is not charged: {plain}");
    assert!(plain["usage"]["memory_peak_bytes"].as_u64().unwrap_or(0) > 1 << 20, "{plain}");
    let [allocate, filesystem, started, first] = assert_phases(&plain, "live exec");
    assert_eq!((allocate, filesystem), (0.0, 0.0), "the sandbox existed already: {plain}");
    assert!(first > started, "the output came before the program started: {plain}");

    let bomb = exec(&server, &id, json!({"argv": ["/usr/bin/python3", "-c", MEMORY_BOMB]}));
    assert_eq!((bomb["oom_killed"].as_bool(), bomb["limit"].as_str()), (Some(true), Some("memory")), "{bomb}");
    assert!(bomb["exit_code"].as_i64() != Some(0), "{bomb}");

    let flood = exec(&server, &id, json!({"cmd": "head -c 100000 /dev/zero | tr '\\0' x"}));
    assert_eq!((flood["stdout_truncated"].as_bool(), flood["limit"].as_str()), (Some(true), Some("output")), "{flood}");
    assert_eq!(flood["stdout"].as_str().map(str::len), Some(4096), "{flood}");

    let slow = exec(&server, &id, json!({"argv": ["sleep", "30"], "timeout_ms": 300}));
    assert_eq!((slow["timed_out"].as_bool(), slow["limit"].as_str()), (Some(true), Some("time")), "{slow}");

    // The stream's exit event carries the same fields as the answer.
    let response = server
        .http()
        .post(format!("{}/v1/sandboxes/{id}/exec", server.url))
        .header("Authorization", format!("Bearer {KEY_1}"))
        .header("Accept", "text/event-stream")
        .send_json(json!({"argv": ["/usr/bin/python3", "-c", MEMORY_BOMB]}))
        .unwrap();
    let text = response.into_body().read_to_string().unwrap();
    let exit = last_exit_event(&text);
    assert_eq!((exit["oom_killed"].as_bool(), exit["limit"].as_str()), (Some(true), Some("memory")), "{text}");
    assert_phases(&exit, "exec stream");
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
}

fn last_exit_event(text: &str) -> Value {
    let block = text.split("\n\n").filter(|b| b.contains("event: exit")).last().unwrap_or_else(|| panic!("{text}"));
    let data = block.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
    serde_json::from_str(data).unwrap()
}

fn a_background_command_and_a_run_carry_the_same_fields(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({"limits": {"memory_bytes": common::small_memory(tier, 96 << 20)}}));
    let body = json!({"argv": ["/usr/bin/python3", "-c", MEMORY_BOMB], "background": true});
    let started = server.call("POST", &format!("/v1/sandboxes/{id}/exec"), KEY_1, Some(body));
    assert_eq!(started.status, 202, "{started:?}");
    let command = started.json["command_id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    let entry = loop {
        let list = server.call("GET", &format!("/v1/sandboxes/{id}/commands"), KEY_1, None);
        let entry = list.json["commands"].as_array().unwrap().iter().find(|c| c["id"] == command).cloned().unwrap();
        if entry["state"] == "exited" {
            break entry;
        }
        assert!(Instant::now() < deadline, "the bomb did not end: {entry}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!((entry["oom_killed"].as_bool(), entry["limit"].as_str()), (Some(true), Some("memory")), "{entry}");
    let path = format!("{}/v1/sandboxes/{id}/commands/{command}/stream", server.url);
    let stream = server.http().get(path).header("Authorization", format!("Bearer {KEY_1}")).call().unwrap();
    let exit = last_exit_event(&stream.into_body().read_to_string().unwrap());
    assert_eq!((exit["oom_killed"].as_bool(), exit["limit"].as_str()), (Some(true), Some("memory")), "{exit}");
    assert!(exit["phases"]["runtime_ready"].as_f64().unwrap_or(0.0) > 0.0, "{exit}");
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);

    let run_on_server = |body: Value| {
        let mut body = body;
        body["isolation"] = json!(tier.name());
        let reply = server.call("POST", "/v1/run", KEY_1, Some(body));
        assert_eq!(reply.status, 200, "{reply:?}");
        reply.json
    };
    let ok = run_on_server(json!({"language": "python", "code": "print(6 * 7)"}));
    assert_eq!(
        (ok["exit_code"].as_i64(), ok["stdout"].as_str(), ok["limit"].clone()),
        (Some(0), Some("42\n"), Value::Null)
    );
    let [allocate, filesystem, started, first] = assert_phases(&ok, "run");
    assert!(
        allocate > 0.0 && filesystem >= allocate && first > started,
        "the run's phases count from its request: {ok}"
    );
    let bomb = run_on_server(
        json!({"language": "python", "code": MEMORY_BOMB, "limits": {"memory_bytes": common::small_memory(tier, 96 << 20)}}),
    );
    assert_eq!((bomb["oom_killed"].as_bool(), bomb["limit"].as_str()), (Some(true), Some("memory")), "{bomb}");
    assert!(bomb["usage"]["memory_peak_bytes"].as_u64().unwrap_or(0) > 32 << 20, "{bomb}");
}
