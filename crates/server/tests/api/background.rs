//! Background commands over the fake runtime: `exec` with `background: true` answers 202 at once; the commands are
//! listed, streamed (replay from the start or from an offset, then live, then exit), fed stdin, signalled and killed;
//! bad input is 400/404/409/422; another tenant gets 404; deleting the sandbox ends its commands.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use futures::StreamExt;
use serde_json::{Value, json};

use crate::harness::{Harness, KEY_A, KEY_B};

/// Splits an SSE body into (event, id, data) triples.
fn events(text: &str) -> Vec<(String, Option<u64>, Value)> {
    text.split("\n\n")
        .filter_map(|block| {
            let event = block.lines().find_map(|l| l.strip_prefix("event: "))?;
            let id = block.lines().find_map(|l| l.strip_prefix("id: ")).map(|id| id.parse().unwrap());
            let data = block.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((event.to_owned(), id, serde_json::from_str(data).unwrap()))
        })
        .collect()
}

/// Concatenated `data` of the `stdout` events.
fn stdout_of(events: &[(String, Option<u64>, Value)]) -> String {
    events.iter().filter(|(name, _, _)| name == "stdout").map(|(_, _, d)| d["data"].as_str().unwrap()).collect()
}

async fn start(h: &Harness, id: &str, body: Value) -> String {
    let mut body = body;
    body["background"] = json!(true);
    let reply = h.post(&format!("/v1/sandboxes/{id}/exec"), KEY_A, body).await;
    assert_eq!(reply.status, 202, "{}", reply.text());
    reply.json()["command_id"].as_str().unwrap().to_owned()
}

async fn wait_exited(h: &Harness, id: &str, command: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let list = h.get(&format!("/v1/sandboxes/{id}/commands"), KEY_A).await.json();
        let found = list["commands"].as_array().unwrap().iter().find(|c| c["id"] == command).cloned().unwrap();
        if found["state"] == "exited" {
            return found;
        }
        assert!(Instant::now() < deadline, "{command} did not end: {found}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_background_command_starts_at_once_and_can_be_replayed_after_its_end() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let started = Instant::now();
    let argv = ["steps", "out:one\n", "err:warn\n", "sleep:300", "out:two\n", "exit:4"];
    let reply = h.post(&format!("/v1/sandboxes/{id}/exec"), KEY_A, json!({"argv": argv, "background": true})).await;
    assert!(started.elapsed() < Duration::from_millis(250), "the POST waited for the command");
    assert_eq!(reply.status, 202, "{}", reply.text());
    let body = reply.json();
    let command = body["command_id"].as_str().unwrap().to_owned();
    assert!(sandkasten_server::ids::is_command_id(&command), "{body}");
    assert_eq!(body["pid"], 100);
    assert!(body["started_at"].as_str().unwrap().ends_with('Z'));

    let list = h.get(&format!("/v1/sandboxes/{id}/commands"), KEY_A).await.json();
    let entry = &list["commands"][0];
    assert_eq!((entry["id"].as_str(), entry["state"].as_str()), (Some(command.as_str()), Some("running")));
    assert_eq!(entry["argv"][0], "steps");
    assert_eq!(entry["exit_code"], Value::Null);
    assert!(entry.get("ended_at").is_none());

    let ended = wait_exited(&h, &id, &command).await;
    assert_eq!((ended["exit_code"].as_i64(), ended["signal"].as_i64()), (Some(4), None));
    assert!(ended["ended_at"].is_string());

    // Replays as often as asked, each time from the start, ending with the exit.
    for _ in 0..2 {
        let reply = h.get(&format!("/v1/sandboxes/{id}/commands/{command}/stream"), KEY_A).await;
        assert_eq!(reply.status, 200);
        assert!(reply.headers["content-type"].to_str().unwrap().starts_with("text/event-stream"));
        let events = events(&reply.text());
        let names: Vec<&str> = events.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(names, ["stdout", "stderr", "stdout", "exit"]);
        assert_eq!(events.iter().map(|e| e.1).collect::<Vec<_>>(), [Some(4), Some(9), Some(13), None]);
        assert_eq!(stdout_of(&events), "one\ntwo\n");
        assert_eq!(events[3].2["exit_code"], 4);
    }
    // The store has its start and end.
    assert_eq!(h.state.store().command_count(&id).await.unwrap(), 1);
}

#[tokio::test]
async fn a_stream_continues_from_an_offset_or_the_last_event_id() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let command = start(&h, &id, json!({"argv": ["steps", "out:abc", "out:def", "exit:0"]})).await;
    wait_exited(&h, &id, &command).await;
    let uri = format!("/v1/sandboxes/{id}/commands/{command}/stream");
    let from_query = events(&h.get(&format!("{uri}?since=4"), KEY_A).await.text());
    assert_eq!(stdout_of(&from_query), "ef");
    let from_header = h.call_with("GET", &uri, Some(KEY_A), Body::empty(), &[("last-event-id", "3")]).await;
    assert_eq!(stdout_of(&events(&from_header.text())), "def");
    let past_the_end = events(&h.get(&format!("{uri}?since=100"), KEY_A).await.text());
    assert_eq!(past_the_end.iter().map(|e| e.0.as_str()).collect::<Vec<_>>(), ["exit"]);
    h.call_with("GET", &uri, Some(KEY_A), Body::empty(), &[("last-event-id", "x")])
        .await
        .assert_error(400, "bad_request");
    h.get(&format!("{uri}?since=-1"), KEY_A).await.assert_error(400, "bad_request");
    h.get(&format!("{uri}?from=1"), KEY_A).await.assert_error(400, "bad_request");
}

#[tokio::test]
async fn live_output_reaches_a_listener_before_the_command_ends() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let command = start(&h, &id, json!({"argv": ["steps", "out:early\n", "sleep:600", "out:late\n"]})).await;
    let request = Request::get(format!("/v1/sandboxes/{id}/commands/{command}/stream"))
        .header("authorization", format!("Bearer {KEY_A}"))
        .body(Body::empty())
        .unwrap();
    let started = Instant::now();
    let mut body = h.send(request).await.into_body().into_data_stream();
    let first = tokio::time::timeout(Duration::from_secs(5), body.next()).await.unwrap().unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("early"));
    assert!(started.elapsed() < Duration::from_millis(500));
    let mut rest = String::new();
    while let Some(frame) = body.next().await {
        rest.push_str(&String::from_utf8_lossy(&frame.unwrap()));
    }
    assert!(rest.contains("late") && rest.contains("event: exit"), "{rest}");
}

#[tokio::test]
async fn stdin_is_written_and_closed() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let cat = start(&h, &id, json!({"argv": ["cat"]})).await;
    let stdin = format!("/v1/sandboxes/{id}/commands/{cat}/stdin");
    assert_eq!(h.post(&stdin, KEY_A, json!({"data": "hello "})).await.status, 204);
    assert_eq!(h.post(&stdin, KEY_A, json!({"data": "world", "eof": true})).await.status, 204);
    let ended = wait_exited(&h, &id, &cat).await;
    assert_eq!(ended["exit_code"], 0);
    let replay = events(&h.get(&format!("/v1/sandboxes/{id}/commands/{cat}/stream"), KEY_A).await.text());
    assert_eq!(stdout_of(&replay), "hello world");
    h.post(&stdin, KEY_A, json!({"data": "more"})).await.assert_error(409, "conflict");
    h.post(&stdin, KEY_A, json!({"data": 5})).await.assert_error(422, "unprocessable");
    h.post(&stdin, KEY_A, json!({"nope": true})).await.assert_error(422, "unprocessable");

    // Stdin given with the start is written and closed.
    let given = start(&h, &id, json!({"argv": ["cat"], "stdin": "given"})).await;
    assert_eq!(wait_exited(&h, &id, &given).await["exit_code"], 0);
    let replay = events(&h.get(&format!("/v1/sandboxes/{id}/commands/{given}/stream"), KEY_A).await.text());
    assert_eq!(stdout_of(&replay), "given");
}

#[tokio::test]
async fn signals_and_kill_end_commands() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let sleeper = start(&h, &id, json!({"argv": ["sleep-ms", "60000"]})).await;
    let signal = format!("/v1/sandboxes/{id}/commands/{sleeper}/signal");
    h.post(&signal, KEY_A, json!({"signal": "SIGBOGUS"})).await.assert_error(422, "unprocessable");
    h.post(&signal, KEY_A, json!({"signal": 99})).await.assert_error(422, "unprocessable");
    h.post(&signal, KEY_A, json!({})).await.assert_error(422, "unprocessable");
    assert_eq!(h.post(&signal, KEY_A, json!({"signal": "SIGTERM"})).await.status, 204);
    let ended = wait_exited(&h, &id, &sleeper).await;
    assert_eq!((ended["exit_code"].as_i64(), ended["signal"].as_i64()), (None, Some(15)));
    h.post(&signal, KEY_A, json!({"signal": 2})).await.assert_error(409, "conflict");

    let other = start(&h, &id, json!({"argv": ["sleep-ms", "60000"]})).await;
    let uri = format!("/v1/sandboxes/{id}/commands/{other}");
    assert_eq!(h.delete(&uri, KEY_A).await.status, 204);
    assert_eq!(wait_exited(&h, &id, &other).await["signal"], 9);
    assert_eq!(h.delete(&uri, KEY_A).await.status, 204, "killing an ended command is a no-op");
    let listed = h.get(&format!("/v1/sandboxes/{id}/commands"), KEY_A).await.json();
    assert_eq!(listed["commands"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn retained_output_stops_at_the_output_limit() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({"limits": {"output_bytes": 1024}})).await;
    let big = "x".repeat(1500);
    let command = start(&h, &id, json!({"argv": ["steps", format!("out:{big}"), "err:e"]})).await;
    let ended = wait_exited(&h, &id, &command).await;
    assert_eq!((ended["stdout_truncated"].as_bool(), ended["stderr_truncated"].as_bool()), (Some(true), Some(false)));
    let replay = events(&h.get(&format!("/v1/sandboxes/{id}/commands/{command}/stream"), KEY_A).await.text());
    assert_eq!(stdout_of(&replay).len(), 1024);
    assert_eq!(replay.last().unwrap().2["stdout_truncated"], true);
}

#[tokio::test]
async fn unknown_commands_and_bad_starts_are_refused() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({"limits": {"timeout_ms": 5000}})).await;
    let base = format!("/v1/sandboxes/{id}/commands");
    for command in ["cmd-0123456789abcdef", "cmd-nope", "..%2F..%2Fetc"] {
        h.get(&format!("{base}/{command}/stream"), KEY_A).await.assert_error(404, "not_found");
        h.post(&format!("{base}/{command}/stdin"), KEY_A, json!({"data": "x"})).await.assert_error(404, "not_found");
        h.post(&format!("{base}/{command}/signal"), KEY_A, json!({"signal": 15})).await.assert_error(404, "not_found");
        h.delete(&format!("{base}/{command}"), KEY_A).await.assert_error(404, "not_found");
    }
    let exec = format!("/v1/sandboxes/{id}/exec");
    h.post(&exec, KEY_A, json!({"background": true})).await.assert_error(422, "unprocessable");
    h.post(&exec, KEY_A, json!({"argv": ["cat"], "background": true, "timeout_ms": 5001}))
        .await
        .assert_error(422, "unprocessable");
    h.post(&exec, KEY_A, json!({"argv": ["cat"], "background": "yes"})).await.assert_error(422, "unprocessable");
    let listed = h.get(&base, KEY_A).await.json();
    assert_eq!(listed, json!({"commands": []}));
    // The runtime got the sandbox's timeout.
    start(&h, &id, json!({"argv": ["cat"]})).await;
    assert_eq!(h.runtime.last_command.lock().unwrap().as_ref().and_then(|c| c.timeout_ms), Some(5000));
}

#[tokio::test]
async fn another_tenant_gets_404_everywhere() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let command = start(&h, &id, json!({"argv": ["cat"]})).await;
    let base = format!("/v1/sandboxes/{id}");
    let requests: Vec<(&str, String, Body)> = vec![
        ("POST", format!("{base}/exec"), Body::from(r#"{"argv": ["cat"], "background": true}"#)),
        ("GET", format!("{base}/commands"), Body::empty()),
        ("GET", format!("{base}/commands/{command}/stream"), Body::empty()),
        ("POST", format!("{base}/commands/{command}/stdin"), Body::from(r#"{"data": "x", "eof": true}"#)),
        ("POST", format!("{base}/commands/{command}/signal"), Body::from(r#"{"signal": "SIGKILL"}"#)),
        ("DELETE", format!("{base}/commands/{command}"), Body::empty()),
    ];
    for (method, uri, body) in requests {
        let message = h.call(method, &uri, Some(KEY_B), body).await.assert_error(404, "not_found");
        assert_eq!(message, format!("sandbox {id} not found"), "{method} {uri}");
    }
    // Nor does the command's id work under bravo's own sandbox.
    let theirs = h.create(KEY_B, json!({})).await;
    let reply = h.get(&format!("/v1/sandboxes/{theirs}/commands/{command}/stream"), KEY_B).await;
    assert_eq!(reply.assert_error(404, "not_found"), format!("no command {command} in this sandbox"));
    let reply = h.delete(&format!("/v1/sandboxes/{theirs}/commands/{command}"), KEY_B).await;
    reply.assert_error(404, "not_found");
    let list = h.get(&format!("{base}/commands"), KEY_A).await.json();
    assert_eq!(list["commands"].as_array().unwrap().len(), 1);
    assert_eq!(list["commands"][0]["state"], "running", "bravo's requests changed nothing");
}

#[tokio::test]
async fn deleting_the_sandbox_ends_its_commands_and_records_them() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let command = start(&h, &id, json!({"argv": ["cat"]})).await;
    let metrics = h.call("GET", "/metrics", None, Body::empty()).await.text();
    assert!(metrics.contains("sandkasten_commands_running 1"), "{metrics}");
    let request = Request::get(format!("/v1/sandboxes/{id}/commands/{command}/stream"))
        .header("authorization", format!("Bearer {KEY_A}"))
        .body(Body::empty())
        .unwrap();
    let listener = h.send(request).await;
    assert_eq!(h.delete(&format!("/v1/sandboxes/{id}"), KEY_A).await.status, 204);
    let text = tokio::time::timeout(Duration::from_secs(5), axum::body::to_bytes(listener.into_body(), usize::MAX))
        .await
        .unwrap()
        .unwrap();
    let ended = events(&String::from_utf8_lossy(&text));
    assert_eq!(ended.last().unwrap().0, "exit");
    assert_eq!(ended.last().unwrap().2["exit_code"], Value::Null);
    h.get(&format!("/v1/sandboxes/{id}/commands"), KEY_A).await.assert_error(409, "conflict");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let metrics = h.call("GET", "/metrics", None, Body::empty()).await.text();
        if metrics.contains("sandkasten_commands_running 0") {
            break;
        }
        assert!(Instant::now() < deadline, "{metrics}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
