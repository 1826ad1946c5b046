//! Filesystem pauses through the API over the fake runtime and a real local snapshot store: `{"mode": "filesystem"}`
//! saves the files and releases the sandbox in the runtime (its row stays, paused, `pause_mode: filesystem`, its
//! snapshot neither listed nor the tenant's to use but charged), requests answer 409 `paused`, a resume makes it again
//! under the same id on its files and deletes the snapshot, a failed resume leaves it paused on the same files, a
//! delete takes the files with it, `auto_pause` with `pause_mode: filesystem` pauses this way at the timeout, a
//! restart (the reconcile) keeps it paused, and a bad mode or a full snapshot quota is refused with nothing changed.

use std::sync::atomic::Ordering;

use sandkasten_server::clock::now_ms;
use sandkasten_server::lifecycle::{expiry, reconcile};
use serde_json::{Value, json};

use crate::harness::{Harness, KEY_A, tenant, test_config};

async fn sandbox_with_a_file(h: &Harness, create: Value) -> String {
    let id = h.create(KEY_A, create).await;
    let put = h.put(&format!("/v1/sandboxes/{id}/files?path=/workspace/notes.txt"), KEY_A, b"kept").await;
    assert_eq!(put.status, 204, "{}", put.text());
    id
}

fn manifests(h: &Harness) -> usize {
    std::fs::read_dir(h.snapshot_dir.path().join("manifests")).map_or(0, |dir| dir.count())
}

fn creates_of(h: &Harness, id: &str) -> usize {
    h.runtime.created.lock().unwrap().iter().filter(|(created, _)| created == id).count()
}

#[tokio::test]
async fn a_filesystem_pause_releases_the_sandbox_and_the_resume_makes_it_again_on_its_files() {
    let h = Harness::new();
    let id = sandbox_with_a_file(&h, json!({})).await;
    let paused = h.post(&format!("/v1/sandboxes/{id}/pause"), KEY_A, json!({"mode": "filesystem"})).await;
    assert_eq!(paused.status, 200, "{}", paused.text());
    assert_eq!(
        (paused.json()["state"].clone(), paused.json()["pause_mode"].clone()),
        (json!("paused"), json!("filesystem"))
    );
    assert!(!h.runtime.is_alive_here(&id), "nothing of it is left in the runtime");
    assert_eq!(manifests(&h), 1, "its files are in the store");
    let listed = h.get("/v1/snapshots", KEY_A).await.json();
    assert_eq!(listed["snapshots"], json!([]), "a pause snapshot is not the tenant's to list: {listed}");
    let exec = h.exec(&id, KEY_A, &["true"]).await;
    exec.assert_error(409, "paused");
    let listed = h.get("/v1/sandboxes?state=paused", KEY_A).await.json();
    assert_eq!(listed["sandboxes"][0]["pause_mode"], "filesystem", "{listed}");

    let resumed = h.post(&format!("/v1/sandboxes/{id}/resume"), KEY_A, json!({})).await;
    assert_eq!(resumed.status, 200, "{}", resumed.text());
    assert_eq!(resumed.json()["state"], "running");
    assert!(resumed.json().get("pause_mode").is_none(), "{}", resumed.text());
    assert_eq!(creates_of(&h, &id), 2, "made again under the same id");
    let read = h.get(&format!("/v1/sandboxes/{id}/files?path=/workspace/notes.txt"), KEY_A).await;
    assert_eq!((read.status.as_u16(), read.text()), (200, "kept".to_owned()));
    assert_eq!(manifests(&h), 0, "the pause snapshot is deleted once used");
    assert_eq!(h.exec(&id, KEY_A, &["true"]).await.status, 200);
}

#[tokio::test]
async fn a_failed_resume_leaves_it_paused_on_the_same_files_and_a_delete_takes_them() {
    let h = Harness::new();
    let id = sandbox_with_a_file(&h, json!({})).await;
    let paused = h.post(&format!("/v1/sandboxes/{id}/pause"), KEY_A, json!({"mode": "filesystem"})).await;
    assert_eq!(paused.status, 200, "{}", paused.text());
    h.runtime.fail_create.store(true, Ordering::SeqCst);
    let failed = h.post(&format!("/v1/sandboxes/{id}/resume"), KEY_A, json!({})).await;
    assert!(failed.status.is_server_error(), "{} {}", failed.status, failed.text());
    assert!(failed.json()["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{}", failed.text());
    let info = h.get(&format!("/v1/sandboxes/{id}"), KEY_A).await.json();
    assert_eq!((info["state"].clone(), info["pause_mode"].clone()), (json!("paused"), json!("filesystem")), "{info}");
    assert!(!h.runtime.is_alive_here(&id), "the half-made sandbox is gone");
    assert_eq!(manifests(&h), 1, "its files are kept");
    h.runtime.fail_create.store(false, Ordering::SeqCst);

    let deleted = h.delete(&format!("/v1/sandboxes/{id}"), KEY_A).await;
    assert_eq!(deleted.status, 204, "{}", deleted.text());
    assert_eq!(manifests(&h), 0, "the files go with the sandbox");
    let again = h.post(&format!("/v1/sandboxes/{id}/resume"), KEY_A, json!({})).await;
    assert_eq!(again.status, 409, "{}", again.text());
}

#[tokio::test]
async fn auto_pause_with_the_filesystem_mode_pauses_so_at_the_timeout_and_a_restart_keeps_it() {
    let h = Harness::new();
    let lifecycle = json!({"auto_pause": true, "pause_mode": "filesystem"});
    let id = sandbox_with_a_file(&h, json!({"timeout_s": 60, "lifecycle": lifecycle})).await;
    assert_eq!(expiry::sweep(&h.state, now_ms() + 120_000).await.unwrap(), 0, "paused, not expired");
    let info = h.get(&format!("/v1/sandboxes/{id}"), KEY_A).await.json();
    assert_eq!((info["state"].clone(), info["pause_mode"].clone()), (json!("paused"), json!("filesystem")), "{info}");
    assert!(!h.runtime.is_alive_here(&id));

    // A restart: the runtime has nothing of it, which is how a filesystem pause leaves it.
    assert_eq!(reconcile::reconcile(&h.state).await.unwrap(), 0, "not lost");
    let info = h.get(&format!("/v1/sandboxes/{id}"), KEY_A).await.json();
    assert_eq!(info["state"], "paused", "{info}");
    let resumed = h.post(&format!("/v1/sandboxes/{id}/resume"), KEY_A, json!({})).await;
    assert_eq!(resumed.status, 200, "{}", resumed.text());
    let read = h.get(&format!("/v1/sandboxes/{id}/files?path=/workspace/notes.txt"), KEY_A).await;
    assert_eq!(read.text(), "kept");
}

#[tokio::test]
async fn auto_resume_makes_a_filesystem_paused_sandbox_again_for_the_request() {
    let h = Harness::new();
    let id = sandbox_with_a_file(&h, json!({"lifecycle": {"auto_resume": true}})).await;
    let paused = h.post(&format!("/v1/sandboxes/{id}/pause"), KEY_A, json!({"mode": "filesystem"})).await;
    assert_eq!(paused.status, 200, "{}", paused.text());
    let read = h.get(&format!("/v1/sandboxes/{id}/files?path=/workspace/notes.txt"), KEY_A).await;
    assert_eq!((read.status.as_u16(), read.text()), (200, "kept".to_owned()));
    assert_eq!(h.get(&format!("/v1/sandboxes/{id}"), KEY_A).await.json()["state"], "running");
}

#[tokio::test]
async fn bad_pause_input_and_a_full_snapshot_quota_change_nothing() {
    let mut config = test_config();
    config.tenants[0] = tenant("alpha", KEY_A, 3, 1 << 30);
    config.tenants[0].max_snapshot_bytes = 10;
    let h = Harness::with_config(config);
    let id = sandbox_with_a_file(&h, json!({})).await;
    let bad = h.post(&format!("/v1/sandboxes/{id}/pause"), KEY_A, json!({"mode": "disk"})).await;
    let message = bad.assert_error(422, "unprocessable");
    assert!(message.contains("memory") && message.contains("filesystem"), "names the modes: {message}");
    let over = h.post(&format!("/v1/sandboxes/{id}/pause"), KEY_A, json!({"mode": "filesystem"})).await;
    let message = over.assert_error(429, "quota_exceeded");
    assert!(message.contains("max_snapshot_bytes"), "{message}");
    assert_eq!(h.get(&format!("/v1/sandboxes/{id}"), KEY_A).await.json()["state"], "running");
    assert!(h.runtime.is_alive_here(&id), "still running");
    assert_eq!(manifests(&h), 0, "nothing kept");
    assert_eq!(h.exec(&id, KEY_A, &["true"]).await.status, 200);
}
