//! Drives the router in-process (`tower::ServiceExt::oneshot`) over an in-memory store and the fake runtime.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use sandkasten_server::config::{ApiKey, TenantConfig};
use sandkasten_server::{AppState, ServerConfig, Store, router};
use sandkasten_snapshot_store::{SnapshotStore, StoreConfig};
use serde_json::Value;
use tower::ServiceExt;

use crate::fake::FakeRuntime;

pub(crate) const KEY_A: &str = "key-of-tenant-alpha-0001";
pub(crate) const KEY_B: &str = "key-of-tenant-bravo-0001";

/// Largest file accepted by the test servers.
pub(crate) const MAX_FILE_BYTES: u64 = 64 << 10;

pub(crate) struct Harness {
    pub(crate) router: Router,
    pub(crate) state: AppState,
    pub(crate) runtime: Arc<FakeRuntime>,
    /// The snapshot store's directory (removed with the harness).
    pub(crate) snapshot_dir: tempfile::TempDir,
}

pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Vec<u8>,
}

impl Reply {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    /// Asserts an error response of the documented shape and returns its message.
    #[track_caller]
    pub(crate) fn assert_error(&self, status: u16, code: &str) -> String {
        let body = String::from_utf8_lossy(&self.body);
        assert_eq!(self.status.as_u16(), status, "{body}");
        let json = self.json();
        let error = json.as_object().and_then(|o| o.get("error")).unwrap_or_else(|| panic!("no error object: {body}"));
        assert_eq!(json.as_object().map(|o| o.len()), Some(1), "{body}");
        assert_eq!(error["code"], code, "{body}");
        let message = error["message"].as_str().unwrap_or_else(|| panic!("no message: {body}"));
        assert!(!message.is_empty());
        message.to_owned()
    }

    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub(crate) fn tenant(name: &str, key: &str, max_sandboxes: u64, max_memory_bytes: u64) -> TenantConfig {
    TenantConfig { api_keys: vec![ApiKey::new(key)], max_sandboxes, max_memory_bytes, ..TenantConfig::new(name) }
}

pub(crate) fn test_config() -> ServerConfig {
    ServerConfig {
        tenants: vec![tenant("alpha", KEY_A, 3, 1 << 30), tenant("bravo", KEY_B, 3, 1 << 30)],
        max_file_bytes: MAX_FILE_BYTES,
        max_json_bytes: 64 << 10,
        ..ServerConfig::default()
    }
}

impl Harness {
    pub(crate) fn new() -> Harness {
        Harness::with_config(test_config())
    }

    pub(crate) fn with_config(config: ServerConfig) -> Harness {
        config.validate().unwrap();
        let runtime = Arc::new(FakeRuntime::default());
        let snapshot_dir = tempfile::tempdir().unwrap();
        let store_config = StoreConfig {
            url: format!("file://{}", snapshot_dir.path().display()),
            gc_grace: std::time::Duration::ZERO,
            ..StoreConfig::default()
        };
        let snapshots = SnapshotStore::open(&store_config).unwrap();
        let state = AppState::new(&config, Store::open_in_memory().unwrap(), snapshots, runtime.clone()).unwrap();
        Harness { router: router(state.clone()), state, runtime, snapshot_dir }
    }

    pub(crate) async fn send(&self, request: Request<Body>) -> axum::response::Response {
        self.router.clone().oneshot(request).await.unwrap()
    }

    pub(crate) async fn call(&self, method: &str, uri: &str, key: Option<&str>, body: Body) -> Reply {
        self.call_with(method, uri, key, body, &[]).await
    }

    pub(crate) async fn call_with(
        &self,
        method: &str,
        uri: &str,
        key: Option<&str>,
        body: Body,
        headers: &[(&str, &str)],
    ) -> Reply {
        let mut builder = Request::builder().method(Method::from_bytes(method.as_bytes()).unwrap()).uri(uri);
        if let Some(key) = key {
            builder = builder.header("authorization", format!("Bearer {key}"));
        }
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let response = self.send(builder.body(body).unwrap()).await;
        let status = response.status();
        let headers = response.headers().clone();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap().to_vec();
        Reply { status, headers, body }
    }

    pub(crate) async fn get(&self, uri: &str, key: &str) -> Reply {
        self.call("GET", uri, Some(key), Body::empty()).await
    }

    pub(crate) async fn delete(&self, uri: &str, key: &str) -> Reply {
        self.call("DELETE", uri, Some(key), Body::empty()).await
    }

    pub(crate) async fn post(&self, uri: &str, key: &str, json: Value) -> Reply {
        let body = Body::from(serde_json::to_vec(&json).unwrap());
        self.call_with("POST", uri, Some(key), body, &[("content-type", "application/json")]).await
    }

    pub(crate) async fn put(&self, uri: &str, key: &str, data: &[u8]) -> Reply {
        self.call("PUT", uri, Some(key), Body::from(data.to_vec())).await
    }

    /// Creates a sandbox for `key` and returns its id.
    pub(crate) async fn create(&self, key: &str, json: Value) -> String {
        let reply = self.post("/v1/sandboxes", key, json).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
        reply.json()["id"].as_str().unwrap().to_owned()
    }

    pub(crate) async fn exec(&self, id: &str, key: &str, argv: &[&str]) -> Reply {
        self.post(&format!("/v1/sandboxes/{id}/exec"), key, serde_json::json!({ "argv": argv })).await
    }
}
