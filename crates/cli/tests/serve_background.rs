//! Background commands end to end against a real `sandkasten serve`: the start returns at once, output streams
//! live and replays after a reconnect (from the start, or after a `Last-Event-ID`), stdin reaches the program, signals
//! and kills end it, the list shows states, another tenant gets 404, and deleting the sandbox kills what still runs.
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::io::Read;
use std::time::{Duration, Instant};

use common::Tier;
use serde_json::{Value, json};
use serve::{KEY_1, KEY_2, Server, assert_sandbox_gone_on};

per_tier!(
    output_streams_live_and_replays_after_a_reconnect,
    stdin_signals_and_kill_reach_the_command,
    a_command_that_ends_before_its_given_stdin_is_closed_still_starts,
    deleting_the_sandbox_kills_its_background_commands,
    the_cli_starts_a_background_command_and_prints_its_id,
);

/// Starts `argv` in the background as t1 and returns the command id.
fn start(server: &Server, id: &str, body: Value) -> String {
    let mut body = body;
    body["background"] = json!(true);
    let reply = server.call("POST", &format!("/v1/sandboxes/{id}/exec"), KEY_1, Some(body));
    assert_eq!(reply.status, 202, "{reply:?}");
    reply.json["command_id"].as_str().unwrap().to_owned()
}

/// Opens the command's event stream (optionally after `last_event_id`).
fn open_stream(server: &Server, id: &str, command: &str, last_event_id: Option<&str>) -> impl Read {
    let mut request = server
        .http()
        .get(format!("{}/v1/sandboxes/{id}/commands/{command}/stream", server.url))
        .header("Authorization", format!("Bearer {KEY_1}"));
    if let Some(last) = last_event_id {
        request = request.header("Last-Event-ID", last);
    }
    let response = request.call().unwrap();
    assert_eq!(response.status(), 200);
    response.into_body().into_reader()
}

/// The whole stream of an ended (or ending) command.
fn stream_text(server: &Server, id: &str, command: &str, last_event_id: Option<&str>) -> String {
    let mut text = String::new();
    open_stream(server, id, command, last_event_id).read_to_string(&mut text).unwrap();
    text
}

/// (event, id, data) of each SSE event.
fn events(text: &str) -> Vec<(String, Option<String>, Value)> {
    text.split("\n\n")
        .filter_map(|block| {
            let event = block.lines().find_map(|l| l.strip_prefix("event: "))?;
            let id = block.lines().find_map(|l| l.strip_prefix("id: ")).map(str::to_owned);
            let data = block.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((event.to_owned(), id, serde_json::from_str(data).unwrap()))
        })
        .collect()
}

fn stdout_of(events: &[(String, Option<String>, Value)]) -> String {
    events.iter().filter(|e| e.0 == "stdout").map(|e| e.2["data"].as_str().unwrap()).collect()
}

fn exit_of(events: &[(String, Option<String>, Value)]) -> Value {
    let last = events.last().expect("no events");
    assert_eq!(last.0, "exit", "the stream ends with exit: {events:?}");
    last.2.clone()
}

/// The command's entry in the list.
fn listed(server: &Server, id: &str, command: &str) -> Value {
    let list = server.call("GET", &format!("/v1/sandboxes/{id}/commands"), KEY_1, None);
    assert_eq!(list.status, 200, "{list:?}");
    list.json["commands"].as_array().unwrap().iter().find(|c| c["id"] == command).cloned().expect("listed")
}

fn wait_exited(server: &Server, id: &str, command: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let entry = listed(server, id, command);
        if entry["state"] == "exited" {
            return entry;
        }
        assert!(Instant::now() < deadline, "{command} did not end: {entry}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn output_streams_live_and_replays_after_a_reconnect(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({}));
    let started = Instant::now();
    let command = start(&server, &id, json!({"argv": ["sh", "-c", "for i in 1 2 3 4 5; do echo $i; sleep 0.3; done"]}));
    let took = started.elapsed();
    assert!(took < Duration::from_millis(500), "the POST took {took:?}: it waited for the command");
    assert_eq!(listed(&server, &id, &command)["state"], "running");

    // Live: the first line arrives while the command still runs; then the client disconnects.
    let mut reader = open_stream(&server, &id, &command, None);
    let mut seen = Vec::new();
    let mut chunk = [0u8; 256];
    while !String::from_utf8_lossy(&seen).contains("\"1\\n\"") {
        let n = reader.read(&mut chunk).unwrap();
        assert!(n > 0, "the stream ended before the first line");
        seen.extend_from_slice(&chunk[..n]);
    }
    assert!(!String::from_utf8_lossy(&seen).contains("event: exit"), "output arrived only at the end");
    let first = events(&String::from_utf8_lossy(&seen));
    let first_id = first[0].1.clone().expect("output events carry an id");
    drop(reader);

    // Reconnect later: the replay has the early lines, then the rest, then exit 0.
    std::thread::sleep(Duration::from_millis(600));
    let replay = events(&stream_text(&server, &id, &command, None));
    assert_eq!(stdout_of(&replay), "1\n2\n3\n4\n5\n");
    let exit = exit_of(&replay);
    assert_eq!((exit["exit_code"].as_i64(), exit["signal"].as_i64()), (Some(0), None));
    // Reconnecting after an event id continues after it; and replays can be repeated.
    let resumed = events(&stream_text(&server, &id, &command, Some(&first_id)));
    assert_eq!(stdout_of(&resumed), "2\n3\n4\n5\n");
    assert_eq!(stdout_of(&events(&stream_text(&server, &id, &command, None))), "1\n2\n3\n4\n5\n");
    let entry = wait_exited(&server, &id, &command);
    assert_eq!(entry["exit_code"], 0);

    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    assert_sandbox_gone_on(tier, &id);
}

fn stdin_signals_and_kill_reach_the_command(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({}));
    let base = format!("/v1/sandboxes/{id}/commands");

    let cat = start(&server, &id, json!({"argv": ["cat"]}));
    let stdin = format!("{base}/{cat}/stdin");
    assert_eq!(server.call("POST", &stdin, KEY_1, Some(json!({"data": "hello\n"}))).status, 204);
    assert_eq!(server.call("POST", &stdin, KEY_1, Some(json!({"data": "bye\n", "eof": true}))).status, 204);
    let entry = wait_exited(&server, &id, &cat);
    assert_eq!(entry["exit_code"], 0, "cat ends at end-of-file: {entry}");
    let echoed = events(&stream_text(&server, &id, &cat, None));
    assert_eq!(stdout_of(&echoed), "hello\nbye\n");
    assert_eq!(exit_of(&echoed)["exit_code"], 0);
    let late = server.call("POST", &stdin, KEY_1, Some(json!({"data": "late"})));
    assert_eq!(late.status, 409, "{late:?}");

    let given = start(&server, &id, json!({"argv": ["cat"], "stdin": "given"}));
    assert_eq!(wait_exited(&server, &id, &given)["exit_code"], 0, "given stdin is closed after writing");
    assert_eq!(stdout_of(&events(&stream_text(&server, &id, &given, None))), "given");

    let sleeper = start(&server, &id, json!({"argv": ["sleep", "100"]}));
    let killed = start(&server, &id, json!({"argv": ["sleep", "100"]}));
    assert_eq!(listed(&server, &id, &sleeper)["state"], "running");
    let term = server.call("POST", &format!("{base}/{sleeper}/signal"), KEY_1, Some(json!({"signal": "SIGTERM"})));
    assert_eq!(term.status, 204, "{term:?}");
    let entry = wait_exited(&server, &id, &sleeper);
    assert_eq!((entry["exit_code"].as_i64(), entry["signal"].as_i64()), (None, Some(15)), "{entry}");
    assert_eq!(exit_of(&events(&stream_text(&server, &id, &sleeper, None)))["signal"], 15);
    assert_eq!(server.call("DELETE", &format!("{base}/{killed}"), KEY_1, None).status, 204);
    assert_eq!(wait_exited(&server, &id, &killed)["signal"], 9);

    // Another tenant sees none of it.
    for (method, path, body) in [
        ("GET", base.clone(), None),
        ("GET", format!("{base}/{cat}/stream"), None),
        ("POST", format!("{base}/{sleeper}/stdin"), Some(json!({"data": "x"}))),
        ("POST", format!("{base}/{sleeper}/signal"), Some(json!({"signal": 9}))),
        ("DELETE", format!("{base}/{sleeper}"), None),
        ("POST", format!("/v1/sandboxes/{id}/exec"), Some(json!({"argv": ["true"], "background": true}))),
    ] {
        let reply = server.call(method, &path, KEY_2, body);
        assert_eq!(reply.status, 404, "{method} {path} as another tenant: {reply:?}");
        assert_eq!(reply.json["error"]["code"], "not_found");
    }
    let all = server.call("GET", &base, KEY_1, None);
    let states: Vec<&str> =
        all.json["commands"].as_array().unwrap().iter().map(|c| c["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["exited"; 4], "{all:?}");

    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    assert_sandbox_gone_on(tier, &id);
}

fn a_command_that_ends_before_its_given_stdin_is_closed_still_starts(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({}));
    // `true` ignores its stdin and may be reaped before the runtime closes the stdin it was given.
    for _ in 0..40 {
        let command = start(&server, &id, json!({"argv": ["true"], "stdin": ""}));
        assert_eq!(wait_exited(&server, &id, &command)["exit_code"], 0);
    }
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    assert_sandbox_gone_on(tier, &id);
}

fn deleting_the_sandbox_kills_its_background_commands(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({}));
    let sleeper = start(&server, &id, json!({"argv": ["sleep", "100"]}));
    start(&server, &id, json!({"cmd": "sh -c 'while :; do sleep 1; done' & sleep 100"}));
    assert_eq!(listed(&server, &id, &sleeper)["state"], "running");
    let mut reader = open_stream(&server, &id, &sleeper, None);
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    // A listener learns that the command is gone.
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("event: exit"), "{rest}");
    assert_sandbox_gone_on(tier, &id);
}

fn the_cli_starts_a_background_command_and_prints_its_id(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({}));
    let output =
        common::Cli::new(["sandbox", "exec", "--background", &id, "--", "sh", "-c", "sleep 0.2; echo from-cli"])
            .env("SANDKASTEN_URL", &server.url)
            .env("SANDKASTEN_API_KEY", KEY_1)
            .output_unlocked();
    assert_eq!(output.code, 0, "{}", output.describe());
    let command = output.stdout_text().trim().to_owned();
    assert!(command.starts_with("cmd-") && command.len() == 20, "{}", output.describe());
    let replay = events(&stream_text(&server, &id, &command, None));
    assert_eq!(stdout_of(&replay), "from-cli\n");
    assert_eq!(exit_of(&replay)["exit_code"], 0);
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    assert_sandbox_gone_on(tier, &id);
}
