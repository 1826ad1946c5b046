//! Exec: JSON results, output capped at the sandbox's output limit, per-command timeouts, and SSE streams whose
//! output reaches the client before the command ends.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use futures::StreamExt;
use serde_json::{Value, json};

use crate::harness::{Harness, KEY_A};

#[tokio::test]
async fn exec_returns_the_result_as_json() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let reply = h.exec(&id, KEY_A, &["echo", "hello", "world"]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body["stdout"], "hello world\n");
    assert_eq!(body["stderr"], "");
    assert_eq!(body["exit_code"], 0);
    assert_eq!(body["signal"], Value::Null);
    assert_eq!(body["timed_out"], false);
    assert_eq!(body["stdout_truncated"], false);
    assert!(body["duration_ms"].as_f64().unwrap() >= 0.0);
    assert_eq!(h.state.store().command_count(&id).await.unwrap(), 1);
}

#[tokio::test]
async fn unknown_program_exits_127_and_shell_strings_are_accepted() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let body = h.exec(&id, KEY_A, &["no-such-program"]).await.json();
    assert_eq!(body["exit_code"], 127);
    assert_eq!(body["stderr"], "no-such-program: command not found\n");
    let reply = h.post(&format!("/v1/sandboxes/{id}/exec"), KEY_A, json!({"cmd": "echo hi"})).await;
    assert_eq!(reply.json()["stderr"], "/bin/bash: command not found\n", "cmd runs through the shell");
}

#[tokio::test]
async fn output_is_cut_at_the_sandbox_output_limit() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({"limits": {"output_bytes": 1024}})).await;
    let body = h.exec(&id, KEY_A, &["bytes", "5000"]).await.json();
    assert_eq!(body["stdout"].as_str().unwrap().len(), 1024);
    assert_eq!(body["stdout_truncated"], true);
}

#[tokio::test]
async fn binary_output_is_given_exactly_in_base64_and_only_there() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let body = h.exec(&id, KEY_A, &["steps", "raw"]).await.json();
    assert_eq!(body["stdout_base64"], "//4=");
    assert_eq!(body["stdout"], "", "binary output is not spelled out as text too");
}

#[tokio::test]
async fn the_runtime_always_gets_a_timeout_within_the_sandbox_limit() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({"limits": {"timeout_ms": 5000}})).await;
    h.exec(&id, KEY_A, &["echo"]).await;
    assert_eq!(h.runtime.last_command.lock().unwrap().as_ref().and_then(|c| c.timeout_ms), Some(5000));
    let uri = format!("/v1/sandboxes/{id}/exec");
    h.post(&uri, KEY_A, json!({"argv": ["echo"], "timeout_ms": 200})).await;
    assert_eq!(h.runtime.last_command.lock().unwrap().as_ref().and_then(|c| c.timeout_ms), Some(200));
    let message =
        h.post(&uri, KEY_A, json!({"argv": ["echo"], "timeout_ms": 5001})).await.assert_error(422, "unprocessable");
    assert!(message.contains("timeout_ms"), "{message}");
}

/// Splits an SSE body into (event, data) pairs.
fn parse_events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter_map(|block| {
            let event = block.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = block.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((event.to_owned(), serde_json::from_str(data).unwrap()))
        })
        .collect()
}

fn sse_request(id: &str, body: Value) -> Request<Body> {
    Request::post(format!("/v1/sandboxes/{id}/exec"))
        .header("authorization", format!("Bearer {KEY_A}"))
        .header("accept", "text/event-stream")
        .body(Body::from(body.to_string()))
        .unwrap()
}

#[tokio::test]
async fn sse_delivers_output_before_the_command_ends() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let started = Instant::now();
    let response =
        h.send(sse_request(&id, json!({"argv": ["steps", "out:first\n", "sleep:700", "err:late\n", "exit:3"]}))).await;
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let mut body = response.into_body().into_data_stream();
    let first = tokio::time::timeout(Duration::from_secs(5), body.next()).await.unwrap().unwrap().unwrap();
    let first_at = started.elapsed();
    let first = String::from_utf8_lossy(&first).into_owned();
    assert!(first.contains("event: stdout") && first.contains("first"), "{first}");
    assert!(first_at < Duration::from_millis(500), "first chunk took {first_at:?}: it was held back");
    assert_eq!(h.runtime.finished_commands.load(Ordering::SeqCst), 0, "the command must still be running");
    let mut rest = String::new();
    while let Some(frame) = body.next().await {
        rest.push_str(&String::from_utf8_lossy(&frame.unwrap()));
    }
    assert!(started.elapsed() >= Duration::from_millis(700));
    let events = parse_events(&format!("{first}{rest}"));
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["stdout", "stderr", "exit"]);
    assert_eq!(events[0].1, json!({"data": "first\n"}));
    assert_eq!(events[1].1, json!({"data": "late\n"}));
    assert_eq!(events[2].1["exit_code"], 3);
    assert_eq!(events[2].1["timed_out"], false);
}

#[tokio::test]
async fn sse_errors_before_the_start_are_plain_json_errors() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let response = h.send(sse_request(&id, json!({}))).await;
    assert_eq!(response.status(), 422);
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("application/json"));
}

#[tokio::test]
async fn a_client_that_leaves_does_not_stop_the_command() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let response = h.send(sse_request(&id, json!({"argv": ["steps", "out:a", "sleep:200", "out:b"]}))).await;
    drop(response);
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.runtime.finished_commands.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(h.runtime.finished_commands.load(Ordering::SeqCst), 1);
}
