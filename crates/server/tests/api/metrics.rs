//! `/metrics` lists the documented counters, gauges and histograms with the values the API caused.

use std::time::Duration;

use axum::body::Body;
use sandkasten_server::clock::now_ms;
use sandkasten_server::lifecycle::expiry;
use serde_json::json;

use crate::harness::{Harness, KEY_A, KEY_B};

async fn scrape(h: &Harness) -> String {
    let reply = h.call("GET", "/metrics", None, Body::empty()).await;
    assert_eq!(reply.status, 200);
    assert!(reply.headers["content-type"].to_str().unwrap().starts_with("text/plain"));
    reply.text()
}

#[track_caller]
fn assert_lists(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

#[tokio::test]
async fn metrics_count_creates_execs_errors_and_active_sandboxes() {
    let h = Harness::new();
    let fresh = scrape(&h).await;
    // Counters with labels are listed at zero before anything happened.
    assert_lists(
        &fresh,
        &[
            "# TYPE sandkasten_limit_kills_total counter",
            "sandkasten_limit_kills_total{kind=\"time\"} 0",
            "# TYPE sandkasten_sandbox_exits_total counter",
            "sandkasten_sandbox_exits_total{reason=\"deleted\"} 0",
            "sandkasten_sandbox_exits_total{reason=\"expired\"} 0",
            "sandkasten_sandbox_exits_total{reason=\"lost\"} 0",
            "sandkasten_sandbox_exits_total{reason=\"run_finished\"} 0",
        ],
    );
    let id = h.create(KEY_A, json!({})).await;
    h.create(KEY_A, json!({})).await;
    h.exec(&id, KEY_A, &["echo", "hi"]).await;
    h.get("/v1/sandboxes/sb-0123456789abcdef", KEY_A).await;
    h.call("GET", "/v1/sandboxes", None, Body::empty()).await;
    h.delete(&format!("/v1/sandboxes/{id}"), KEY_A).await;
    let text = scrape(&h).await;
    assert_lists(
        &text,
        &[
            "# TYPE sandkasten_sandboxes_active gauge",
            "sandkasten_sandboxes_active 1",
            "# TYPE sandkasten_sandbox_creates_total counter",
            "sandkasten_sandbox_creates_total 2",
            "# TYPE sandkasten_sandbox_create_seconds histogram",
            "sandkasten_sandbox_create_seconds_count 2",
            "# TYPE sandkasten_exec_duration_seconds histogram",
            "sandkasten_exec_duration_seconds_count 1",
            "# TYPE sandkasten_exec_phase_seconds histogram",
            "sandkasten_exec_phase_seconds_count{phase=\"first_output\"} 1",
            "sandkasten_exec_phase_seconds_count{phase=\"total\"} 1",
            "sandkasten_sandbox_exits_total{reason=\"deleted\"} 1",
            "sandkasten_limit_kills_total{kind=\"time\"} 0",
            "sandkasten_errors_total{code=\"not_found\"} 1",
            "sandkasten_errors_total{code=\"unauthorized\"} 1",
        ],
    );
}

#[tokio::test]
async fn a_command_without_output_has_a_total_but_no_first_output() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    h.exec(&id, KEY_A, &["sleep-ms", "1"]).await;
    let text = scrape(&h).await;
    assert_lists(&text, &["sandkasten_exec_phase_seconds_count{phase=\"total\"} 1"]);
    assert!(!text.contains("sandkasten_exec_phase_seconds_count{phase=\"first_output\"}"), "{text}");
}

#[tokio::test]
async fn timeouts_of_execs_background_commands_and_cells_count_as_time_kills() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let exec = h.exec(&id, KEY_A, &["timeout"]).await;
    assert_eq!(exec.json()["timed_out"], true);
    // A command that ends normally is not a kill.
    h.exec(&id, KEY_A, &["bytes", "10"]).await;
    let exec_url = format!("/v1/sandboxes/{id}/exec");
    let started = h.post(&exec_url, KEY_A, json!({"argv": ["timeout"], "background": true})).await;
    assert_eq!(started.status, 202);
    let cell = h
        .post(
            &format!("/v1/sandboxes/{id}/code"),
            KEY_A,
            json!({"language": "python", "code": "hang", "timeout_ms": 20}),
        )
        .await;
    assert_eq!(cell.status, 200, "{}", cell.text());
    // A cell that raises (well before its timeout) was not stopped by it.
    h.post(&format!("/v1/sandboxes/{id}/code"), KEY_A, json!({"language": "python", "code": "raise"})).await;
    h.post("/v1/run", KEY_A, json!({"argv": ["timeout"]})).await;
    // The background command's end is recorded by a task.
    for _ in 0..200 {
        if scrape(&h).await.contains("sandkasten_commands_running 0") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_lists(
        &scrape(&h).await,
        &["sandkasten_limit_kills_total{kind=\"time\"} 4", "sandkasten_commands_running 0"],
    );
}

#[tokio::test]
async fn sandbox_exits_are_counted_by_reason() {
    let h = Harness::new();
    let deleted = h.create(KEY_A, json!({})).await;
    h.delete(&format!("/v1/sandboxes/{deleted}"), KEY_A).await;
    h.create(KEY_A, json!({"timeout_s": 1})).await;
    assert_eq!(expiry::sweep(&h.state, now_ms() + 5_000).await.unwrap(), 1);
    let lost = h.create(KEY_B, json!({})).await;
    h.exec(&lost, KEY_B, &["steps", "gone"]).await;
    assert_eq!(h.post("/v1/run", KEY_B, json!({"argv": ["echo", "hi"]})).await.status, 200);
    let text = scrape(&h).await;
    assert_lists(
        &text,
        &[
            "sandkasten_sandbox_exits_total{reason=\"deleted\"} 1",
            "sandkasten_sandbox_exits_total{reason=\"expired\"} 1",
            "sandkasten_sandbox_exits_total{reason=\"lost\"} 1",
            "sandkasten_sandbox_exits_total{reason=\"run_finished\"} 1",
            "sandkasten_sandbox_create_seconds_count 4",
            "sandkasten_sandboxes_active 0",
        ],
    );
}

#[tokio::test]
async fn every_metric_is_named_sandkasten_and_require_auth_asks_for_a_key() {
    let h = Harness::new();
    let text = scrape(&h).await;
    let names: Vec<&str> = text
        .lines()
        .filter(|line| !line.is_empty())
        .map(|line| line.trim_start_matches("# TYPE ").trim_start_matches("# HELP "))
        .collect();
    assert!(names.len() > 20, "{text}");
    for line in names {
        assert!(line.starts_with("sandkasten_"), "a metric without the sandkasten_ prefix: {line}");
    }

    let mut config = crate::harness::test_config();
    config.metrics.require_auth = true;
    let h = Harness::with_config(config);
    let refused = h.call("GET", "/metrics", None, Body::empty()).await;
    refused.assert_error(401, "unauthorized");
    let reply = h.call("GET", "/metrics", Some(KEY_B), Body::empty()).await;
    assert_eq!(reply.status, 200);
    assert!(reply.text().contains("sandkasten_sandboxes_active"));
}
