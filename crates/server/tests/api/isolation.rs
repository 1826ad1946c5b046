//! Tenant isolation: every operation on another tenant's sandbox is a 404 (never 403), identical to an unknown id,
//! and leaves the sandbox untouched; lists never show it.

use axum::body::Body;
use serde_json::json;

use crate::harness::{Harness, KEY_A, KEY_B};

#[tokio::test]
async fn another_tenants_sandbox_is_404_for_every_route() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({"metadata": {"owner": "alpha"}})).await;
    assert_eq!(h.put(&format!("/v1/sandboxes/{id}/files?path=/workspace/secret"), KEY_A, b"s3cret").await.status, 204);
    let unknown = "sb-0123456789abcdef";
    for target in [id.as_str(), unknown] {
        let base = format!("/v1/sandboxes/{target}");
        let requests: Vec<(&str, String, Body)> = vec![
            ("GET", base.clone(), Body::empty()),
            ("POST", format!("{base}/timeout"), Body::from(r#"{"timeout_s": 600}"#)),
            ("POST", format!("{base}/exec"), Body::from(r#"{"argv": ["echo", "hi"]}"#)),
            ("GET", format!("{base}/files?path=/workspace/secret"), Body::empty()),
            ("PUT", format!("{base}/files?path=/workspace/secret"), Body::from("overwritten")),
            ("DELETE", format!("{base}/files?path=/workspace/secret"), Body::empty()),
            ("GET", format!("{base}/files/list?path=/workspace"), Body::empty()),
            ("GET", format!("{base}/files/stat?path=/workspace/secret"), Body::empty()),
            ("POST", format!("{base}/files/mkdir"), Body::from(r#"{"path": "/workspace/d"}"#)),
            ("POST", format!("{base}/files/rename"), Body::from(r#"{"from": "/workspace/secret", "to": "/tmp/x"}"#)),
            ("GET", format!("{base}/files/archive?path=/workspace"), Body::empty()),
            ("PUT", format!("{base}/files/archive?path=/workspace"), Body::from(vec![0u8; 1024])),
            ("DELETE", base.clone(), Body::empty()),
        ];
        for (method, uri, body) in requests {
            let reply = h.call(method, &uri, Some(KEY_B), body).await;
            let message = reply.assert_error(404, "not_found");
            assert_eq!(message, format!("sandbox {target} not found"), "{method} {uri}");
        }
    }
    // Nothing changed for the owner.
    let reply = h.get(&format!("/v1/sandboxes/{id}/files?path=/workspace/secret"), KEY_A).await;
    assert_eq!((reply.status.as_u16(), reply.body.as_slice()), (200, b"s3cret".as_slice()));
    assert_eq!(h.get(&format!("/v1/sandboxes/{id}"), KEY_A).await.json()["state"], "running");
    assert!(h.runtime.ids().contains(&id));
    assert_eq!(h.state.store().command_count(&id).await.unwrap(), 0, "bravo's exec must not have run");
}

#[tokio::test]
async fn lists_show_only_the_callers_sandboxes() {
    let h = Harness::new();
    let a = h.create(KEY_A, json!({"metadata": {"k": "v"}})).await;
    let b = h.create(KEY_B, json!({"metadata": {"k": "v"}})).await;
    for (key, own, other) in [(KEY_A, &a, &b), (KEY_B, &b, &a)] {
        for uri in ["/v1/sandboxes", "/v1/sandboxes?metadata.k=v", "/v1/sandboxes?state=all"] {
            let list = h.get(uri, key).await.json();
            let ids: Vec<&str> =
                list["sandboxes"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
            assert_eq!(ids, vec![own.as_str()], "{uri}");
            assert!(!ids.contains(&other.as_str()));
        }
    }
}
