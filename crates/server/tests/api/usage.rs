//! `GET /v1/sandboxes/{id}/metrics`: the sandbox's usage samples, a reading taken at each request while it runs
//! (none while it is paused), its limits, the range filter, and nothing of another tenant's.

use std::time::Duration;

use serde_json::json;

use crate::harness::{Harness, KEY_A, KEY_B};

#[tokio::test]
async fn metrics_carry_a_reading_per_request_and_the_sandboxs_limits() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({"limits": {"cpus": 0.5, "memory_bytes": 64 << 20}})).await;
    let uri = format!("/v1/sandboxes/{id}/metrics");
    let first = h.get(&uri, KEY_A).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let body = first.json();
    assert_eq!((body["sandbox_id"].as_str(), body["cpus"].as_f64()), (Some(id.as_str()), Some(0.5)));
    assert_eq!(body["memory_limit_bytes"], 64 << 20);
    assert_eq!(body["samples"].as_array().unwrap().len(), 1, "{body}");
    assert_eq!(body["samples"][0]["disk_used_bytes"], 0);

    h.put(&format!("/v1/sandboxes/{id}/files?path=/workspace/a"), KEY_A, &[7u8; 1000]).await;
    // A reading within a second of the last sample replaces it; this one is past it and adds one.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let second = h.get(&uri, KEY_A).await.json();
    let samples = second["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 2, "{second}");
    assert_eq!(samples[1]["disk_used_bytes"], 1000);
    assert_eq!(samples[1]["memory_used_bytes"], (1 << 20) + 1000);
    assert!(samples[1]["cpu_used_pct"].as_f64().unwrap() > 0.0, "{second}");

    // The range: to_ms before the second sample keeps only the first; a backwards range is refused.
    let first_ms = samples[0]["timestamp_ms"].as_i64().unwrap();
    let only_first = h.get(&format!("{uri}?to_ms={first_ms}"), KEY_A).await.json();
    assert_eq!(only_first["samples"].as_array().unwrap().len(), 1, "{only_first}");
    let backwards = h.get(&format!("{uri}?from_ms=20&to_ms=10"), KEY_A).await;
    assert!(backwards.assert_error(400, "bad_request").contains("from_ms"));
    h.get(&format!("/v1/sandboxes/{id}/metrics"), KEY_B).await.assert_error(404, "not_found");
}

#[tokio::test]
async fn a_paused_sandbox_keeps_its_samples_and_gets_no_new_ones() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let uri = format!("/v1/sandboxes/{id}/metrics");
    assert_eq!(h.get(&uri, KEY_A).await.json()["samples"].as_array().unwrap().len(), 1);
    assert_eq!(h.post(&format!("/v1/sandboxes/{id}/pause"), KEY_A, json!({})).await.status, 200);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let paused = h.get(&uri, KEY_A).await;
    assert_eq!(paused.status, 200, "{}", paused.text());
    assert_eq!(paused.json()["samples"].as_array().unwrap().len(), 1, "no reading of a paused sandbox");
}
