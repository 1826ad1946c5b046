//! Every result says which isolation tier ran it, over the fake runtime: `exec` (its JSON answer and its stream's
//! `exit` event), background commands (`GET …/commands` and their stream's `exit` event), code cells (the JSON answer
//! and the stream's `end` event) and `/v1/run` (once, at the top of its answer), for a sandbox on `gvisor` beside one
//! on `process`, so that a tier copied from anywhere but the sandbox's own record would show.

use std::time::{Duration, Instant};

use axum::body::Body;
use serde_json::{Value, json};

use crate::harness::{Harness, KEY_A};

/// The `data` of the first `name` event of an SSE body.
fn event_data(text: &str, name: &str) -> Value {
    let marker = format!("event: {name}\n");
    let block = text.split("\n\n").find(|block| block.contains(&marker)).unwrap_or_else(|| panic!("no {name}: {text}"));
    let data = block.lines().find_map(|line| line.strip_prefix("data: ")).unwrap();
    serde_json::from_str(data).unwrap()
}

async fn sse(h: &Harness, uri: &str, body: Value) -> String {
    let body = Body::from(body.to_string());
    let reply = h.call_with("POST", uri, Some(KEY_A), body, &[("accept", "text/event-stream")]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.text()
}

/// One sandbox per tier: (tier, id).
async fn sandboxes(h: &Harness) -> [(&'static str, String); 2] {
    let gvisor = h.create(KEY_A, json!({"isolation": "gvisor"})).await;
    let process = h.create(KEY_A, json!({"isolation": "process"})).await;
    [("gvisor", gvisor), ("process", process)]
}

#[tokio::test]
async fn exec_answers_and_exit_events_name_the_tier() {
    let h = Harness::new();
    for (tier, id) in sandboxes(&h).await {
        let uri = format!("/v1/sandboxes/{id}/exec");
        let body = h.post(&uri, KEY_A, json!({"argv": ["echo", "hi"]})).await.json();
        assert_eq!((body["isolation"]["tier"].clone(), body["stdout"].clone()), (json!(tier), json!("hi\n")), "{body}");
        let exit = event_data(&sse(&h, &uri, json!({"argv": ["echo", "hi"]})).await, "exit");
        assert_eq!(exit["isolation"]["tier"], tier, "{exit}");
        assert_eq!(exit["exit_code"], 0, "{exit}");
    }
}

#[tokio::test]
async fn background_commands_name_the_tier_while_running_and_at_their_exit() {
    let h = Harness::new();
    for (tier, id) in sandboxes(&h).await {
        let started = h
            .post(&format!("/v1/sandboxes/{id}/exec"), KEY_A, json!({"argv": ["sleep-ms", "200"], "background": true}))
            .await;
        assert_eq!(started.status, 202, "{}", started.text());
        let command = started.json()["command_id"].as_str().unwrap().to_owned();
        let listed = |body: Value| body["commands"].as_array().unwrap().iter().find(|c| c["id"] == command).cloned();
        let running = listed(h.get(&format!("/v1/sandboxes/{id}/commands"), KEY_A).await.json()).unwrap();
        assert_eq!((running["state"].clone(), running["isolation"]["tier"].clone()), (json!("running"), json!(tier)));
        let stream = h.get(&format!("/v1/sandboxes/{id}/commands/{command}/stream"), KEY_A).await.text();
        let exit = event_data(&stream, "exit");
        assert_eq!((exit["isolation"]["tier"].clone(), exit["exit_code"].clone()), (json!(tier), json!(0)), "{exit}");
        let deadline = Instant::now() + Duration::from_secs(5);
        let ended = loop {
            let found = listed(h.get(&format!("/v1/sandboxes/{id}/commands"), KEY_A).await.json()).unwrap();
            if found["state"] == "exited" || Instant::now() > deadline {
                break found;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(
            (ended["state"].clone(), ended["isolation"]["tier"].clone()),
            (json!("exited"), json!(tier)),
            "{ended}"
        );
    }
}

#[tokio::test]
async fn code_cells_name_the_tier_in_the_answer_and_the_end_event() {
    let h = Harness::new();
    for (tier, id) in sandboxes(&h).await {
        let uri = format!("/v1/sandboxes/{id}/code");
        let body = h.post(&uri, KEY_A, json!({"language": "python", "code": "x + 1"})).await.json();
        assert_eq!(
            (body["isolation"]["tier"].clone(), body["execution_count"].clone()),
            (json!(tier), json!(1)),
            "{body}"
        );
        let end = event_data(&sse(&h, &uri, json!({"language": "python", "code": "print:hi"})).await, "end");
        assert_eq!((end["isolation"]["tier"].clone(), end["stdout"].clone()), (json!(tier), json!("hi")), "{end}");
    }
}

#[tokio::test]
async fn a_run_names_its_tier_once() {
    let h = Harness::new();
    for tier in ["gvisor", "process"] {
        let reply = h.post("/v1/run", KEY_A, json!({"isolation": tier, "argv": ["echo", "x"]})).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.json()["isolation"]["tier"], tier, "{}", reply.text());
        let keys = reply.text().matches("\"isolation\"").count();
        assert_eq!(keys, 1, "the flattened exec result and the run must not both write it: {}", reply.text());
        let exit = event_data(&sse(&h, "/v1/run", json!({"isolation": tier, "argv": ["echo", "x"]})).await, "exit");
        assert_eq!(exit["isolation"]["tier"], tier, "{exit}");
    }
}
