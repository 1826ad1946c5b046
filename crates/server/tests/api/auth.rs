//! Authentication: no key, a wrong key, a wrong scheme → 401 JSON; the right key → the tenant's view.

use axum::body::Body;
use serde_json::json;

use crate::harness::{Harness, KEY_A};

#[tokio::test]
async fn missing_key_is_401_with_a_json_error() {
    let h = Harness::new();
    let reply = h.call("GET", "/v1/sandboxes", None, Body::empty()).await;
    let message = reply.assert_error(401, "unauthorized");
    assert!(message.contains("Authorization: Bearer"), "{message}");
    assert_eq!(reply.headers.get("www-authenticate").and_then(|v| v.to_str().ok()), Some("Bearer"));
}

#[tokio::test]
async fn wrong_key_or_scheme_is_401() {
    let h = Harness::new();
    for header in [
        "Bearer key-of-tenant-alpha-0002",
        "Bearer key-of-tenant-alpha-000",
        "Bearer ",
        &format!("Basic {KEY_A}"),
        KEY_A,
    ] {
        let reply = h.call_with("GET", "/v1/sandboxes", None, Body::empty(), &[("authorization", header)]).await;
        let message = reply.assert_error(401, "unauthorized");
        assert!(!message.contains(KEY_A), "the key must never be echoed: {message}");
    }
}

#[tokio::test]
async fn right_key_acts_as_its_tenant() {
    let h = Harness::new();
    let reply = h.post("/v1/sandboxes", KEY_A, json!({})).await;
    assert_eq!(reply.status, 201, "{}", reply.text());
    assert_eq!(reply.json()["tenant"], "alpha");
    assert_eq!(h.get("/v1/sandboxes", KEY_A).await.status, 200);
}

#[tokio::test]
async fn unauthenticated_upload_is_refused_before_the_body_is_read() {
    let h = Harness::new();
    let huge = Body::from(vec![0u8; 10 << 20]);
    let reply = h.call("PUT", "/v1/sandboxes/sb-0000000000000000/files?path=/workspace/x", None, huge).await;
    reply.assert_error(401, "unauthorized");
}

#[tokio::test]
async fn health_metrics_and_openapi_need_no_key() {
    let h = Harness::new();
    for uri in ["/healthz", "/metrics", "/openapi.json"] {
        assert_eq!(h.call("GET", uri, None, Body::empty()).await.status, 200, "{uri}");
    }
}

#[tokio::test]
async fn insecure_mode_serves_everything_as_the_default_tenant() {
    let config = sandkasten_server::ServerConfig { insecure_no_auth: true, ..Default::default() };
    let h = Harness::with_config(config);
    let reply = h.call("POST", "/v1/sandboxes", None, Body::from("{}")).await;
    assert_eq!(reply.status, 201, "{}", reply.text());
    assert_eq!(reply.json()["tenant"], "default");
}
