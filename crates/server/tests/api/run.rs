//! `POST /v1/run`: one call creates a sandbox, writes files and code, runs, and destroys the sandbox on every path
//! (errors and a client that hangs up included); the sandbox counts against the quota while it lives.

use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use futures::StreamExt;
use serde_json::{Value, json};

use crate::harness::{Harness, KEY_A, KEY_B, Reply};

fn parse_events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter_map(|block| {
            let event = block.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = block.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((event.to_owned(), serde_json::from_str(data).unwrap()))
        })
        .collect()
}

fn run_request(body: &Value, stream: bool) -> Request<Body> {
    let mut builder = Request::post("/v1/run").header("authorization", format!("Bearer {KEY_A}"));
    if stream {
        builder = builder.header("accept", "text/event-stream");
    }
    builder.body(Body::from(body.to_string())).unwrap()
}

async fn run(h: &Harness, body: Value) -> Reply {
    h.post("/v1/run", KEY_A, body).await
}

/// Waits until the fake runtime holds no sandbox.
async fn all_destroyed(h: &Harness) {
    for _ in 0..200 {
        if h.runtime.ids().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("sandboxes left: {:?}", h.runtime.ids());
}

async fn state_of(h: &Harness, id: &str) -> String {
    h.get(&format!("/v1/sandboxes/{id}"), KEY_A).await.json()["state"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_command_runs_and_its_sandbox_is_destroyed() {
    let h = Harness::new();
    let reply = run(&h, json!({"argv": ["echo", "hi"]})).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body["stdout"], "hi\n");
    assert_eq!(body["exit_code"], 0);
    assert_eq!(body["timed_out"], false);
    assert!(body.get("error").is_none(), "{body}");
    let id = body["sandbox_id"].as_str().unwrap();
    assert!(h.runtime.ids().is_empty(), "destroyed before the answer");
    assert_eq!(state_of(&h, id).await, "destroyed");
    let exit = run(&h, json!({"argv": ["steps", "err:bad\n", "exit:3"]})).await.json();
    assert_eq!((exit["exit_code"].clone(), exit["stderr"].clone()), (json!(3), json!("bad\n")));
}

#[tokio::test]
async fn phases_from_the_request_come_in_order_in_the_answer_the_stream_and_the_metrics() {
    let h = Harness::new();
    let body = run(&h, json!({"argv": ["steps", "sleep:20", "out:late\n"]})).await.json();
    let phase = |name: &str| body["phases"][name].as_f64().unwrap_or_else(|| panic!("no {name} in {body}"));
    let (allocate, files, started, first) =
        (phase("allocate"), phase("filesystem_ready"), phase("runtime_ready"), phase("first_command"));
    let total = body["duration_ms"].as_f64().unwrap_or(-1.0);
    assert!(0.0 <= allocate && allocate <= files && files <= started && started <= first && first <= total, "{body}");
    assert!(first - started >= 20.0, "the output came after the command's 20 ms sleep: {body}");
    // The exit fields every exec result carries are there too.
    for field in ["oom_killed", "limit", "usage", "timed_out"] {
        assert!(body.get(field).is_some(), "no {field} in {body}");
    }
    let silent = run(&h, json!({"argv": ["sleep-ms", "30"]})).await.json();
    let silent_first = silent["phases"]["first_command"].as_f64().unwrap_or(-1.0);
    assert!(silent_first - silent["phases"]["runtime_ready"].as_f64().unwrap_or(0.0) >= 30.0, "{silent}");
    let response = h.send(run_request(&json!({"argv": ["echo", "x"]}), true)).await;
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    let events = parse_events(&String::from_utf8_lossy(&bytes));
    let exit = &events.last().unwrap().1;
    let end = exit["duration_ms"].as_f64().unwrap();
    assert!(end >= exit["phases"]["first_command"].as_f64().unwrap(), "{exit}");
    assert!(exit["phases"]["first_command"].as_f64().unwrap() >= exit["phases"]["allocate"].as_f64().unwrap());
    let metrics = h.call("GET", "/metrics", None, Body::empty()).await.text();
    for name in ["allocate", "filesystem_ready", "runtime_ready", "first_command", "total"] {
        let count = format!("sandkasten_run_phase_seconds_count{{phase=\"{name}\"}} 3");
        assert!(metrics.contains(&count), "no {count} in {metrics}");
    }
}

#[tokio::test]
async fn code_is_written_to_tmp_and_run_with_env_and_stdin() {
    let h = Harness::new();
    let reply = run(&h, json!({"language": "python", "code": "print(4)", "env": {"A": "b"}, "stdin": "in"})).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let command = h.runtime.last_command.lock().unwrap().clone().unwrap();
    assert_eq!(command.argv, Some(vec!["python3".to_owned(), "/tmp/main.py".to_owned()]));
    assert_eq!(command.env.get("A").map(String::as_str), Some("b"));
    assert_eq!(command.stdin.as_deref(), Some("in"));
    assert_eq!(command.timeout_ms, Some(10_000));
    for (language, program) in [("node", "node"), ("bash", "bash")] {
        run(&h, json!({"language": language, "code": "x"})).await;
        let argv = h.runtime.last_command.lock().unwrap().clone().unwrap().argv.unwrap();
        assert_eq!(argv[0], program);
    }
}

#[tokio::test]
async fn a_failed_compile_is_a_compile_error_and_nothing_else_runs() {
    let h = Harness::new();
    // The fake has no gcc: it exits 127, as a failed compile would exit non-zero.
    let reply = run(&h, json!({"language": "c", "code": "int main( {"})).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body["error"]["code"], "compile_error", "{body}");
    assert_eq!(body["exit_code"], 127);
    assert!(body["stderr"].as_str().unwrap().contains("gcc"), "{body}");
    let last = h.runtime.last_command.lock().unwrap().clone().unwrap().argv.unwrap();
    assert_eq!(last[..2], ["gcc".to_owned(), "-O1".to_owned()]);
    assert!(h.runtime.ids().is_empty());
}

#[tokio::test]
async fn files_are_written_before_the_command_runs() {
    let h = Harness::new();
    let files = json!([{"path": "data/in.txt", "content": "x"}, {"path": "/tmp/b.bin", "content_base64": "AAH/"}]);
    let reply = run(&h, json!({"argv": ["echo", "ok"], "files": files})).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    // A file the runtime refuses (a directory) fails the run with the files API's status; the sandbox still goes.
    let refused = run(&h, json!({"argv": ["echo"], "files": [{"path": "/workspace", "content": "x"}]})).await;
    refused.assert_error(409, "conflict");
    assert!(h.runtime.ids().is_empty());
    let running = h.get("/v1/sandboxes", KEY_A).await.json();
    assert_eq!(running["sandboxes"], json!([]));
}

#[tokio::test]
async fn bad_requests_are_refused_before_anything_exists() {
    let h = Harness::new();
    run(&h, json!({})).await.assert_error(422, "unprocessable");
    run(&h, json!({"language": "cobol", "code": "x"})).await.assert_error(422, "unprocessable");
    run(&h, json!({"language": "python"})).await.assert_error(422, "unprocessable");
    run(&h, json!({"code": "x"})).await.assert_error(422, "unprocessable");
    run(&h, json!({"language": "python", "code": "x", "argv": ["ls"]})).await.assert_error(422, "unprocessable");
    run(&h, json!({"argv": ["ls"], "limits": {"memory_bytes": 1}})).await.assert_error(422, "unprocessable");
    run(&h, json!({"argv": ["ls"], "env": {"A-B": "x"}})).await.assert_error(422, "unprocessable");
    run(&h, json!({"argv": ["ls"], "nope": 1})).await.assert_error(422, "unprocessable");
    let traversal = json!({"argv": ["ls"], "files": [{"path": "/workspace/../etc/x", "content": ""}]});
    run(&h, traversal).await.assert_error(400, "bad_request");
    h.call("POST", "/v1/run", Some(KEY_A), Body::from("{")).await.assert_error(400, "bad_request");
    h.call("POST", "/v1/run", None, Body::from("{}")).await.assert_error(401, "unauthorized");
    assert!(h.runtime.ids().is_empty());
    let all = h.get("/v1/sandboxes?state=all", KEY_A).await.json();
    assert_eq!(all["sandboxes"], json!([]));
}

#[tokio::test]
async fn runs_count_against_the_quota_while_they_live() {
    let h = Harness::new();
    for _ in 0..3 {
        h.create(KEY_A, json!({})).await;
    }
    run(&h, json!({"argv": ["echo"]})).await.assert_error(429, "quota_exceeded");
    // Another tenant is not affected, and finished runs free their place.
    for _ in 0..5 {
        assert_eq!(h.post("/v1/run", KEY_B, json!({"argv": ["echo"]})).await.status, 200);
    }
    // While a run lives it holds a place.
    let h = Harness::new();
    h.create(KEY_A, json!({})).await;
    h.create(KEY_A, json!({})).await;
    let slow = tokio::spawn({
        let router = h.router.clone();
        async move {
            use tower::ServiceExt;
            router.oneshot(run_request(&json!({"argv": ["sleep-ms", "400"]}), false)).await.unwrap()
        }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    run(&h, json!({"argv": ["echo"]})).await.assert_error(429, "quota_exceeded");
    assert_eq!(slow.await.unwrap().status(), 200);
    assert_eq!(run(&h, json!({"argv": ["echo"]})).await.status, 200);
}

#[tokio::test]
async fn sse_streams_output_then_an_exit_event() {
    let h = Harness::new();
    let body = json!({"argv": ["steps", "out:a\n", "sleep:300", "err:b\n", "exit:2"]});
    let response = h.send(run_request(&body, true)).await;
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let mut stream = response.into_body().into_data_stream();
    let first = tokio::time::timeout(Duration::from_secs(5), stream.next()).await.unwrap().unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("event: stdout"));
    assert_eq!(h.runtime.ids().len(), 1, "the run is still going");
    let mut text = String::from_utf8_lossy(&first).into_owned();
    while let Some(frame) = stream.next().await {
        text.push_str(&String::from_utf8_lossy(&frame.unwrap()));
    }
    let events = parse_events(&text);
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["stdout", "stderr", "exit"]);
    let exit = &events[2].1;
    assert_eq!(exit["exit_code"], 2);
    assert!(exit["sandbox_id"].as_str().unwrap().starts_with("sb-"));
    assert!(h.runtime.ids().is_empty());
}

#[tokio::test]
async fn a_client_that_hangs_up_ends_the_run_and_its_sandbox() {
    let h = Harness::new();
    // Streaming: drop the body after the first event.
    let body = json!({"argv": ["steps", "out:started\n", "sleep:30000"]});
    let response = h.send(run_request(&body, true)).await;
    let mut stream = response.into_body().into_data_stream();
    tokio::time::timeout(Duration::from_secs(5), stream.next()).await.unwrap();
    assert_eq!(h.runtime.ids().len(), 1);
    drop(stream);
    all_destroyed(&h).await;
    // JSON: the request future is dropped while the command runs.
    let pending = h.send(run_request(&json!({"argv": ["sleep-ms", "30000"]}), false));
    assert!(tokio::time::timeout(Duration::from_millis(200), pending).await.is_err());
    all_destroyed(&h).await;
    for _ in 0..100 {
        let running = h.get("/v1/sandboxes", KEY_A).await.json();
        if running["sandboxes"] == json!([]) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the runs' sandboxes are still recorded as running");
}
