//! Isolation tiers through the API, over the fake runtime: a misspelt `isolation` is 422 naming the allowed values; a
//! tier this build cannot run (`microvm`, `auto`) or this host cannot (the fake's `unavailable_tiers`) is 422
//! `tier_unavailable` with the reason, and nothing is created (no row, no runtime call); the server's default applies
//! to requests that name none (the E2B facade's included) and every create reaches the runtime with its tier set;
//! records, runs and pools show the tier; a pool member of one tier never serves a request for another.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::StatusCode;
use sandkasten_server::{PoolConfig, ServerConfig, ServerError};
use sandkasten_types::{Limits, Tier};
use serde_json::{Value, json};

use crate::fake::FakeRuntime;
use crate::harness::{Harness, KEY_A, Reply, test_config};

const NO_RUNSC: &str = "isolation \"gvisor\" needs runsc, which is not installed: scripts/setup.sh installs it";

fn with_default(tier: Tier) -> ServerConfig {
    let mut config = test_config();
    config.defaults.isolation = tier;
    config
}

/// Asserts that no request so far created anything: no runtime call, no row.
async fn nothing_created(h: &Harness) {
    assert_eq!(h.runtime.created_tiers(), Vec::new(), "the runtime was asked to create");
    let listed = h.get("/v1/sandboxes?state=all", KEY_A).await.json();
    assert_eq!(listed["sandboxes"], json!([]), "a row remained");
}

async fn e2b_create(h: &Harness) -> Reply {
    let body = Body::from(json!({"templateID": "base", "timeout": 60}).to_string());
    h.call_with("POST", "/v2/sandboxes", None, body, &[("x-api-key", KEY_A), ("content-type", "application/json")])
        .await
}

#[tokio::test]
async fn a_misspelt_tier_is_422_naming_the_allowed_values() {
    let h = Harness::new();
    for (uri, body) in [
        ("/v1/sandboxes", json!({"isolation": "gvsior"})),
        ("/v1/run", json!({"isolation": "gvsior", "argv": ["echo"]})),
    ] {
        let reply = h.post(uri, KEY_A, body).await;
        let message = reply.assert_error(422, "unprocessable");
        assert!(message.contains("gvsior") && message.contains("process, gvisor, microvm, auto"), "{message}");
        // Well-formed JSON of the wrong type is a 422 that names the tiers too (not a "syntax error" 400).
        let message = h.post(uri, KEY_A, json!({"isolation": 2})).await.assert_error(422, "unprocessable");
        assert!(message.contains("process, gvisor, microvm, auto"), "{message}");
    }
    nothing_created(&h).await;
}

#[tokio::test]
async fn a_tier_the_host_cannot_run_is_refused_before_anything_exists() {
    let h = Harness::with_config(with_default(Tier::Gvisor));
    h.runtime.unavailable_tiers.lock().unwrap().insert(Tier::Gvisor, NO_RUNSC.into());
    let requests = [
        ("/v1/sandboxes", json!({"isolation": "gvisor"})),
        ("/v1/sandboxes", json!({})),
        ("/v1/run", json!({"isolation": "gvisor", "language": "python", "code": "print(1)"})),
        ("/v1/run", json!({"cmd": "ls"})),
    ];
    for (uri, body) in requests {
        let message = h.post(uri, KEY_A, body.clone()).await.assert_error(422, "tier_unavailable");
        assert_eq!(message, NO_RUNSC, "{uri} {body}");
    }
    let sse = h
        .call_with("POST", "/v1/run", Some(KEY_A), Body::from(r#"{"cmd": "ls"}"#), &[("accept", "text/event-stream")])
        .await;
    assert_eq!(sse.assert_error(422, "tier_unavailable"), NO_RUNSC, "refused before any stream starts");
    let reply = e2b_create(&h).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
    assert_eq!(reply.json()["message"], NO_RUNSC);
    nothing_created(&h).await;
    // The tier the host has still works.
    let created = h.post("/v1/sandboxes", KEY_A, json!({"isolation": "process"})).await;
    assert_eq!((created.status, created.json()["isolation"]["tier"].clone()), (StatusCode::CREATED, json!("process")));
    let metrics = h.call("GET", "/metrics", None, Body::empty()).await.text();
    assert!(metrics.contains("code=\"tier_unavailable\""), "{metrics}");
}

#[tokio::test]
async fn the_configured_default_applies_to_every_create_naming_none() {
    let h = Harness::with_config(with_default(Tier::Gvisor));
    let created = h.post("/v1/sandboxes", KEY_A, json!({})).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
    assert_eq!(created.json()["isolation"]["tier"], "gvisor");
    let id = created.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(h.get(&format!("/v1/sandboxes/{id}"), KEY_A).await.json()["isolation"]["tier"], "gvisor");
    let chosen = h.create(KEY_A, json!({"isolation": "process"})).await;
    let listed = h.get("/v1/sandboxes", KEY_A).await.json();
    let tiers: Vec<(Value, Value)> = listed["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["id"].clone(), s["isolation"]["tier"].clone()))
        .collect();
    assert_eq!(tiers, [(json!(id), json!("gvisor")), (json!(chosen), json!("process"))]);
    let ran = h.post("/v1/run", KEY_A, json!({"argv": ["echo", "hi"]})).await;
    assert_eq!(
        (ran.status, ran.json()["isolation"]["tier"].clone()),
        (StatusCode::OK, json!("gvisor")),
        "{}",
        ran.text()
    );
    assert_eq!(e2b_create(&h).await.status, StatusCode::CREATED);
    let expected = [Tier::Gvisor, Tier::Process, Tier::Gvisor, Tier::Gvisor].map(Some);
    assert_eq!(h.runtime.created_tiers(), expected, "the runtime always gets the resolved tier");
}

#[tokio::test]
async fn without_a_configured_default_sandboxes_run_on_process() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    assert_eq!(h.get(&format!("/v1/sandboxes/{id}"), KEY_A).await.json()["isolation"]["tier"], "process");
    let ran = h.post("/v1/run", KEY_A, json!({"isolation": "gvisor", "cmd": "echo"})).await;
    assert_eq!(ran.json()["isolation"]["tier"], "gvisor", "{}", ran.text());
    assert_eq!(h.runtime.created_tiers(), [Some(Tier::Process), Some(Tier::Gvisor)]);
}

#[tokio::test]
async fn the_run_stream_says_the_tier_in_its_exit_event() {
    let h = Harness::new();
    let body = Body::from(r#"{"isolation": "gvisor", "argv": ["echo", "x"]}"#);
    let reply = h.call_with("POST", "/v1/run", Some(KEY_A), body, &[("accept", "text/event-stream")]).await;
    let text = reply.text();
    let exit = text.split("event: exit\ndata: ").nth(1).and_then(|rest| rest.lines().next()).unwrap_or_default();
    let exit: Value = serde_json::from_str(exit).unwrap_or_else(|e| panic!("no exit event ({e}): {text}"));
    assert_eq!(exit["isolation"]["tier"], "gvisor", "{exit}");
}

/// Aborts the refill task when the test ends.
struct Refill(tokio::task::JoinHandle<()>);

impl Drop for Refill {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn pool(name: &str, isolation: Option<Tier>, pids: u64) -> PoolConfig {
    let limits = Limits { pids, ..Limits::default() };
    PoolConfig { name: Some(name.into()), isolation, limits, min: 1, max: 1, ..toml::from_str("").unwrap() }
}

/// Waits (up to 5 s) until every pool holds a ready member.
async fn pools_ready(h: &Harness) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let pools = h.get("/v1/pools", KEY_A).await.json()["pools"].as_array().cloned().unwrap_or_default();
        if pools.iter().all(|p| p["ready"] == 1) {
            return pools;
        }
        assert!(Instant::now() < deadline, "pools never filled: {pools:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The tier the runtime created sandbox `id` with.
fn tier_of(h: &Harness, id: &str) -> Option<Tier> {
    h.runtime.created.lock().unwrap().iter().find(|(created, _)| created == id).and_then(|(_, spec)| spec.isolation)
}

#[tokio::test]
async fn a_pool_member_never_serves_a_request_for_another_tier() {
    let mut config = with_default(Tier::Gvisor);
    // Same limits, two tiers; and a gvisor-only class.
    config.pools = vec![pool("fast", Some(Tier::Process), 64), pool("strong", None, 64), pool("odd", None, 32)];
    let h = Harness::with_config(config);
    let _refill = Refill(tokio::spawn(sandkasten_server::lifecycle::refill::run(h.state.clone())));
    let pools = pools_ready(&h).await;
    let tiers: Vec<(Value, Value)> = pools.iter().map(|p| (p["name"].clone(), p["isolation"].clone())).collect();
    assert_eq!(
        tiers,
        [(json!("fast"), json!("process")), (json!("strong"), json!("gvisor")), (json!("odd"), json!("gvisor"))]
    );
    let members = |name: &str| pools.iter().find(|p| p["name"] == name).unwrap().clone();
    assert_eq!(members("fast")["hits"], 0);

    let strong = h.create(KEY_A, json!({"limits": {"pids": 64}})).await;
    assert_eq!(tier_of(&h, &strong), Some(Tier::Gvisor), "the default tier took the gvisor member");
    let fast = h.create(KEY_A, json!({"isolation": "process", "limits": {"pids": 64}})).await;
    assert_eq!(tier_of(&h, &fast), Some(Tier::Process));
    let hits = |pools: &[Value], name: &str| pools.iter().find(|p| p["name"] == name).unwrap()["hits"].clone();
    let after = h.get("/v1/pools", KEY_A).await.json()["pools"].as_array().cloned().unwrap();
    assert_eq!((hits(&after, "fast"), hits(&after, "strong")), (json!(1), json!(1)), "{after:?}");

    // No process pool has these limits: a process request must not take the gvisor member.
    let ran = h.post("/v1/run", KEY_A, json!({"isolation": "process", "limits": {"pids": 32}, "cmd": "echo"})).await;
    assert_eq!(
        (ran.status, ran.json()["isolation"]["tier"].clone()),
        (StatusCode::OK, json!("process")),
        "{}",
        ran.text()
    );
    let used = ran.json()["sandbox_id"].as_str().unwrap().to_owned();
    assert_eq!(tier_of(&h, &used), Some(Tier::Process), "a fresh process sandbox, not the pool's");
    let after = h.get("/v1/pools", KEY_A).await.json()["pools"].as_array().cloned().unwrap();
    let odd = after.iter().find(|p| p["name"] == "odd").unwrap();
    assert_eq!((odd["hits"].clone(), odd["misses"].clone(), odd["ready"].clone()), (json!(0), json!(0), json!(1)));
    let listed = h.get("/v1/sandboxes", KEY_A).await.json();
    let shown: Vec<Value> =
        listed["sandboxes"].as_array().unwrap().iter().map(|s| s["isolation"]["tier"].clone()).collect();
    assert_eq!(shown, [json!("gvisor"), json!("process")]);
}

#[tokio::test]
async fn the_server_does_not_start_on_a_tier_the_host_cannot_run() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Arc::new(FakeRuntime::default());
    runtime.unavailable_tiers.lock().unwrap().insert(Tier::Gvisor, NO_RUNSC.into());
    let mut pooled = test_config();
    pooled.pools = vec![pool("strong", Some(Tier::Gvisor), 64)];
    let settings = [(with_default(Tier::Gvisor), "defaults.isolation"), (pooled, "pools[0].isolation")];
    for (config, setting) in settings {
        let config = ServerConfig { database: dir.path().join("sandkasten.db"), ..config };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ended = sandkasten_server::serve_on(listener, config, runtime.clone(), std::future::pending::<()>()).await;
        let message = match ended {
            Err(ServerError::Config(error)) => error.to_string(),
            other => panic!("expected a config error, got {other:?}"),
        };
        assert!(message.ends_with(&format!("\n  {setting}: \"gvisor\": {NO_RUNSC}")), "{message}");
    }
    assert!(runtime.created_tiers().is_empty());
}
