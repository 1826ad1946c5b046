//! Per-tenant quotas: running sandboxes, their summed memory and their summed pids limits; over quota is a 429 that
//! names the quota, and ending a sandbox frees its share. One tenant's use never counts against another. A sandbox
//! asking for more pids than one sandbox may have (`max_pids`) is a 422 naming the cap, before anything exists.

use serde_json::json;

use crate::harness::{Harness, KEY_A, KEY_B, tenant, test_config};

#[tokio::test]
async fn sandbox_count_quota_is_429_and_freed_by_delete() {
    let h = Harness::new();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(h.create(KEY_A, json!({})).await);
    }
    let reply = h.post("/v1/sandboxes", KEY_A, json!({})).await;
    let message = reply.assert_error(429, "quota_exceeded");
    assert!(message.contains("max_sandboxes") && message.contains('3'), "{message}");
    assert_eq!(h.runtime.ids().len(), 3, "a refused sandbox must not be created");
    h.create(KEY_B, json!({})).await;
    assert_eq!(h.delete(&format!("/v1/sandboxes/{}", ids[0]), KEY_A).await.status, 204);
    h.create(KEY_A, json!({})).await;
}

#[tokio::test]
async fn memory_quota_sums_the_running_sandboxes() {
    let mut config = test_config();
    config.tenants[0] = tenant("alpha", KEY_A, 10, 512 << 20);
    let h = Harness::with_config(config);
    h.create(KEY_A, json!({"limits": {"memory_bytes": 256 << 20}})).await;
    let second = h.create(KEY_A, json!({"limits": {"memory_bytes": 200 << 20}})).await;
    let reply = h.post("/v1/sandboxes", KEY_A, json!({"limits": {"memory_bytes": 100 << 20}})).await;
    let message = reply.assert_error(429, "quota_exceeded");
    assert!(message.contains("max_memory_bytes"), "{message}");
    h.delete(&format!("/v1/sandboxes/{second}"), KEY_A).await;
    h.create(KEY_A, json!({"limits": {"memory_bytes": 100 << 20}})).await;
}

#[tokio::test]
async fn pids_quota_sums_the_running_sandboxes_and_a_sandbox_over_the_cap_is_422() {
    let mut config = test_config();
    config.tenants[0].max_pids = 1000;
    config.max_pids = Some(700);
    let h = Harness::with_config(config);
    let first = h.create(KEY_A, json!({"limits": {"pids": 600}})).await;
    let reply = h.post("/v1/sandboxes", KEY_A, json!({"limits": {"pids": 500}})).await;
    let message = reply.assert_error(429, "quota_exceeded");
    assert!(message.contains("max_pids") && message.contains("1000"), "{message}");
    let reply = h.post("/v1/sandboxes", KEY_A, json!({"limits": {"pids": 701}})).await;
    let message = reply.assert_error(422, "unprocessable");
    assert!(message.contains("701") && message.contains("700") && message.contains("max_pids"), "{message}");
    let run = h.post("/v1/run", KEY_A, json!({"argv": ["echo"], "limits": {"pids": 701}})).await;
    run.assert_error(422, "unprocessable");
    assert_eq!(h.runtime.ids().len(), 1, "a refused sandbox must not be created");
    h.delete(&format!("/v1/sandboxes/{first}"), KEY_A).await;
    h.create(KEY_A, json!({"limits": {"pids": 700}})).await;
}
