//! Sandbox lifecycle: create → get/list (metadata filters) → timeout → delete; expiry destroys and frees quota;
//! the startup reconcile records the tenants, marks dead sandboxes and commands left running lost; a failed create
//! leaves nothing behind.

use std::sync::atomic::Ordering;

use sandkasten_server::clock::now_ms;
use sandkasten_server::lifecycle::{expiry, reconcile};
use sandkasten_server::store::CommandRecord;
use sandkasten_types::CommandExit;
use serde_json::json;

use crate::harness::{Harness, KEY_A};

#[tokio::test]
async fn created_sandbox_has_the_documented_fields() {
    let h = Harness::new();
    let reply = h
        .post(
            "/v1/sandboxes",
            KEY_A,
            json!({"template": "host", "limits": {"memory_bytes": 64 << 20}, "env": {"TOKEN": "secret-value"},
                   "metadata": {"user": "u1"}, "timeout_s": 60}),
        )
        .await;
    assert_eq!(reply.status, 201, "{}", reply.text());
    let body = reply.json();
    let id = body["id"].as_str().unwrap();
    assert!(id.starts_with("sb-") && id.len() == 19, "{id}");
    assert_eq!(body["state"], "running");
    assert_eq!(body["template"], "host");
    assert_eq!(body["limits"]["memory_bytes"], 64 << 20);
    assert_eq!(body["limits"]["pids"], 128, "omitted limits take their defaults");
    assert_eq!(body["metadata"], json!({"user": "u1"}));
    assert_eq!(body["env_names"], json!(["TOKEN"]));
    assert!(!reply.text().contains("secret-value"), "env values are not echoed");
    assert!(body["created_at"].as_str().unwrap().ends_with('Z'));
    assert!(h.runtime.ids().contains(id));
    assert_eq!(h.get(&format!("/v1/sandboxes/{id}"), KEY_A).await.json(), body);
}

#[tokio::test]
async fn list_filters_by_metadata_and_state() {
    let h = Harness::new();
    let a = h.create(KEY_A, json!({"metadata": {"team": "x", "run": "1"}})).await;
    let b = h.create(KEY_A, json!({"metadata": {"team": "x", "run": "2"}})).await;
    let ids = |reply: crate::harness::Reply| -> Vec<String> {
        reply.json()["sandboxes"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(ids(h.get("/v1/sandboxes?metadata.team=x", KEY_A).await), vec![a.clone(), b.clone()]);
    assert_eq!(ids(h.get("/v1/sandboxes?metadata.team=x&metadata.run=2", KEY_A).await), vec![b.clone()]);
    assert_eq!(ids(h.get("/v1/sandboxes?metadata.team=y", KEY_A).await), Vec::<String>::new());
    h.delete(&format!("/v1/sandboxes/{a}"), KEY_A).await;
    assert_eq!(ids(h.get("/v1/sandboxes", KEY_A).await), vec![b.clone()]);
    assert_eq!(ids(h.get("/v1/sandboxes?state=destroyed", KEY_A).await), vec![a.clone()]);
    assert_eq!(ids(h.get("/v1/sandboxes?state=all", KEY_A).await), vec![a, b]);
}

#[tokio::test]
async fn list_pages_by_cursor_without_shifting_while_sandboxes_come_and_go() {
    let h = Harness::new();
    let mut made = Vec::new();
    // Three: the harness tenant's max_sandboxes.
    for _ in 0..3 {
        made.push(h.create(KEY_A, json!({"metadata": {"team": "p"}})).await);
        // Distinct creation times (ms), so the expected order is the creation order.
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    let page = |uri: String| {
        let h = &h;
        async move {
            let reply = h.get(&uri, KEY_A).await;
            assert_eq!(reply.status, 200, "{}", reply.text());
            let json = reply.json();
            let ids: Vec<String> =
                json["sandboxes"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_owned()).collect();
            (ids, json["next_cursor"].as_str().map(str::to_owned))
        }
    };
    // Oldest first, as without paging.
    let (all, none) = page("/v1/sandboxes?metadata.team=p".into()).await;
    assert_eq!((&all, none), (&made, None), "without limit: everything, no cursor");
    let (first, cursor) = page("/v1/sandboxes?metadata.team=p&limit=2".into()).await;
    assert_eq!(first, all[..2]);
    let cursor = cursor.expect("more follow");
    // Between two pages one listed sandbox ends and a new one starts: the next page still starts right after the last
    // one listed (an offset of 2 would now skip all[2]).
    h.delete(&format!("/v1/sandboxes/{}", all[0]), KEY_A).await;
    let newest = h.create(KEY_A, json!({"metadata": {"team": "p"}})).await;
    let (second, cursor) = page(format!("/v1/sandboxes?metadata.team=p&limit=2&cursor={cursor}")).await;
    assert_eq!(second, vec![all[2].clone(), newest.clone()]);
    assert_eq!(cursor, None, "the last page has no cursor");
    // Exactly a page left: no cursor either.
    let (exact, cursor) = page("/v1/sandboxes?metadata.team=p&limit=3".into()).await;
    assert_eq!((exact, cursor), (vec![all[1].clone(), all[2].clone(), newest], None));
    // The cursor pages whatever the filter: state=all lists the ended one first.
    let (ended_first, cursor) = page("/v1/sandboxes?state=all&metadata.team=p&limit=1".into()).await;
    assert_eq!(ended_first, vec![all[0].clone()]);
    let (then, _) = page(format!("/v1/sandboxes?state=all&metadata.team=p&limit=1&cursor={}", cursor.unwrap())).await;
    assert_eq!(then, vec![all[1].clone()]);
}

#[tokio::test]
async fn timeout_moves_the_expiry() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({"timeout_s": 10})).await;
    let before = h.get(&format!("/v1/sandboxes/{id}"), KEY_A).await.json()["expires_at"].clone();
    let reply = h.post(&format!("/v1/sandboxes/{id}/timeout"), KEY_A, json!({"timeout_s": 3600})).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(reply.json()["expires_at"].as_str().unwrap() > before.as_str().unwrap());
    // An hour from now is not expired; a sweep two hours ahead expires it.
    assert_eq!(expiry::sweep(&h.state, now_ms() + 1_800_000).await.unwrap(), 0);
    assert_eq!(expiry::sweep(&h.state, now_ms() + 7_200_000).await.unwrap(), 1);
}

#[tokio::test]
async fn delete_destroys_and_is_idempotent() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    assert_eq!(h.delete(&format!("/v1/sandboxes/{id}"), KEY_A).await.status, 204);
    assert!(!h.runtime.ids().contains(&id));
    let record = h.get(&format!("/v1/sandboxes/{id}"), KEY_A).await.json();
    assert_eq!((record["state"].as_str(), record["end_reason"].as_str()), (Some("destroyed"), Some("deleted")));
    assert_eq!(h.delete(&format!("/v1/sandboxes/{id}"), KEY_A).await.status, 204);
    let message = h.exec(&id, KEY_A, &["echo", "hi"]).await.assert_error(409, "conflict");
    assert!(message.contains("destroyed"), "{message}");
}

#[tokio::test]
async fn expiry_destroys_the_sandbox_and_frees_its_quota() {
    let h = Harness::new();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(h.create(KEY_A, json!({"timeout_s": 1})).await);
    }
    h.post("/v1/sandboxes", KEY_A, json!({})).await.assert_error(429, "quota_exceeded");
    assert_eq!(expiry::sweep(&h.state, now_ms() + 1_000).await.unwrap(), 3);
    assert!(h.runtime.ids().is_empty(), "expired sandboxes must be destroyed in the runtime");
    let record = h.get(&format!("/v1/sandboxes/{}", ids[0]), KEY_A).await.json();
    assert_eq!(record["state"], "expired");
    assert!(record["ended_at"].is_string());
    h.exec(&ids[0], KEY_A, &["echo"]).await.assert_error(409, "conflict");
    h.create(KEY_A, json!({})).await;
}

#[tokio::test]
async fn the_background_sweeper_expires_sandboxes_within_seconds() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({"timeout_s": 1})).await;
    let sweeper = tokio::spawn(expiry::run(h.state.clone()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while h.runtime.ids().contains(&id) && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    sweeper.abort();
    assert_eq!(h.get(&format!("/v1/sandboxes/{id}"), KEY_A).await.json()["state"], "expired");
}

#[tokio::test]
async fn reconcile_marks_dead_sandboxes_lost() {
    let h = Harness::new();
    let alive = h.create(KEY_A, json!({})).await;
    let dead = h.create(KEY_A, json!({})).await;
    h.runtime.kill(&dead);
    assert_eq!(reconcile::reconcile(&h.state).await.unwrap(), 1);
    assert_eq!(h.get(&format!("/v1/sandboxes/{dead}"), KEY_A).await.json()["state"], "lost");
    assert_eq!(h.get(&format!("/v1/sandboxes/{alive}"), KEY_A).await.json()["state"], "running");
    let metrics = h.call("GET", "/metrics", None, axum::body::Body::empty()).await.text();
    assert!(metrics.contains("sandkasten_sandbox_exits_total{reason=\"lost\"} 1"), "{metrics}");
}

#[tokio::test]
async fn reconcile_marks_commands_left_running_lost_and_records_the_tenants() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let record = |command: &str| CommandRecord {
        id: command.into(),
        sandbox_id: id.clone(),
        tenant: "alpha".into(),
        argv: vec!["sleep".into()],
        started_ms: now_ms(),
    };
    // A command whose end a previous server never recorded, and one that ended normally.
    h.state.store().start_command(record("cmd-00000000000000a1")).await.unwrap();
    h.state.store().start_command(record("cmd-00000000000000a2")).await.unwrap();
    h.state.store().finish_command("cmd-00000000000000a2", Some(CommandExit::default()), now_ms()).await.unwrap();
    assert_eq!(reconcile::register_tenants(&h.state).await.unwrap(), 2);
    assert_eq!(reconcile::reconcile(&h.state).await.unwrap(), 0);
    let lost = h.state.store().command_state("cmd-00000000000000a1").await.unwrap().unwrap();
    assert_eq!(lost.end_reason.as_deref(), Some("lost"));
    assert!(lost.ended_ms.is_some());
    let done = h.state.store().command_state("cmd-00000000000000a2").await.unwrap().unwrap();
    assert_eq!(done.end_reason.as_deref(), Some("exited"));
    let tenants: Vec<String> = h.state.store().tenants().await.unwrap().into_iter().map(|t| t.name).collect();
    assert_eq!(tenants, ["alpha", "bravo"]);
}

#[tokio::test]
async fn a_sandbox_that_dies_during_a_request_becomes_lost() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    h.exec(&id, KEY_A, &["steps", "gone"]).await.assert_error(409, "conflict");
    assert_eq!(h.get(&format!("/v1/sandboxes/{id}"), KEY_A).await.json()["state"], "lost");
    h.create(KEY_A, json!({})).await;
}

#[tokio::test]
async fn failed_create_leaves_nothing_behind() {
    let h = Harness::new();
    h.runtime.fail_create.store(true, Ordering::SeqCst);
    for _ in 0..4 {
        let message = h.post("/v1/sandboxes", KEY_A, json!({})).await.assert_error(500, "internal");
        assert!(!message.contains("fake"), "internal details stay in the log: {message}");
    }
    let all = h.get("/v1/sandboxes?state=all", KEY_A).await.json();
    assert_eq!(all["sandboxes"], json!([]));
    h.runtime.fail_create.store(false, Ordering::SeqCst);
    h.create(KEY_A, json!({})).await;
}

#[tokio::test]
async fn a_failed_runtime_part_is_a_503_healthz_with_the_reason_and_its_dead_sandboxes_are_marked_lost() {
    let mut config = crate::harness::test_config();
    config.tenants[0] = crate::harness::tenant("alpha", KEY_A, 1, 1 << 30);
    let h = Harness::with_config(config);
    let healthy = h.call("GET", "/healthz", None, axum::body::Body::empty()).await;
    assert_eq!((healthy.status.as_u16(), healthy.json()["status"].clone()), (200, json!("ok")));
    let id = h.create(KEY_A, json!({})).await;

    // The runtime's spawner died with the sandbox: /healthz says so, and the dead sandbox holds the quota until the
    // sweeper hears of it.
    *h.runtime.unhealthy.lock().unwrap() = Some("the spawner exited; it is being restarted".into());
    h.runtime.kill(&id);
    let why = Some("the guest kernel panicked: Kernel panic - not syncing: Attempted to kill init!".to_owned());
    h.runtime.lost.lock().unwrap().push(sandkasten_runtime::LostSandbox { id: id.clone(), why });
    let down = h.call("GET", "/healthz", None, axum::body::Body::empty()).await;
    assert_eq!(down.status.as_u16(), 503, "{}", down.text());
    assert_eq!(down.json()["status"], "unavailable");
    assert!(down.json()["reason"].as_str().unwrap().contains("spawner exited"), "{}", down.text());
    h.post("/v1/sandboxes", KEY_A, json!({})).await.assert_error(429, "quota_exceeded");
    assert_eq!(expiry::sweep_lost(&h.state).await.unwrap(), 1);
    assert_eq!(expiry::sweep_lost(&h.state).await.unwrap(), 0, "reported once");
    let info = h.get(&format!("/v1/sandboxes/{id}"), KEY_A).await.json();
    assert_eq!(info["state"], "lost", "{info}");
    assert_eq!(
        info["end_reason"],
        "its processes died: the guest kernel panicked: Kernel panic - not syncing: Attempted to kill init!",
        "the tier's reason is the sandbox's end reason: {info}"
    );

    // Recovered: healthy again, and the freed quota admits a new sandbox.
    *h.runtime.unhealthy.lock().unwrap() = None;
    assert_eq!(h.call("GET", "/healthz", None, axum::body::Body::empty()).await.status.as_u16(), 200);
    h.create(KEY_A, json!({})).await;
}

#[tokio::test]
async fn ended_sandboxes_stay_queryable_within_the_retention_and_are_pruned_after_it() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    assert_eq!(h.delete(&format!("/v1/sandboxes/{id}"), KEY_A).await.status, 204);
    let day_ms = 86_400_000;
    let within = expiry::prune(&h.state, now_ms() + 6 * day_ms).await.unwrap();
    assert_eq!(within.sandboxes, 0, "{within:?}");
    assert_eq!(h.get(&format!("/v1/sandboxes/{id}"), KEY_A).await.json()["state"], "destroyed");
    let after = expiry::prune(&h.state, now_ms() + 8 * day_ms).await.unwrap();
    assert_eq!(after.sandboxes, 1, "{after:?}");
    assert_eq!(h.get(&format!("/v1/sandboxes/{id}"), KEY_A).await.status.as_u16(), 404);
}
