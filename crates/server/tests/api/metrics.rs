//! `/metrics` lists the documented counters, gauge and histogram with the values the API caused.

use axum::body::Body;
use serde_json::json;

use crate::harness::{Harness, KEY_A};

#[tokio::test]
async fn metrics_count_creates_execs_errors_and_active_sandboxes() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    h.create(KEY_A, json!({})).await;
    h.exec(&id, KEY_A, &["echo", "hi"]).await;
    h.get("/v1/sandboxes/sb-0123456789abcdef", KEY_A).await;
    h.call("GET", "/v1/sandboxes", None, Body::empty()).await;
    h.delete(&format!("/v1/sandboxes/{id}"), KEY_A).await;
    let reply = h.call("GET", "/metrics", None, Body::empty()).await;
    assert_eq!(reply.status, 200);
    assert!(reply.headers["content-type"].to_str().unwrap().starts_with("text/plain"));
    let text = reply.text();
    for needle in [
        "# TYPE sandboxes_active gauge",
        "sandboxes_active 1",
        "# TYPE sandbox_creates_total counter",
        "sandbox_creates_total 2",
        "# TYPE exec_duration_seconds histogram",
        "exec_duration_seconds_count 1",
        "errors_total{code=\"not_found\"} 1",
        "errors_total{code=\"unauthorized\"} 1",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}
