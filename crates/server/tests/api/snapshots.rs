//! Snapshots and forks through the API over the fake runtime and a real local snapshot store (a temporary
//! directory): take, list, get, restore into a new sandbox, delete (its chunks go); a foreign or deleted snapshot is
//! 404, memory on a tier that cannot is 409 naming what to do, a damaged chunk makes a restore 409 naming the
//! snapshot with no sandbox left, a snapshot over the stored-bytes quota is 429 with nothing kept; forks copy files
//! and refuse bad counts.

use std::path::Path;

use serde_json::{Value, json};

use crate::harness::{Harness, KEY_A, KEY_B, tenant, test_config};

async fn sandbox_with_files(h: &Harness) -> String {
    let id = h.create(KEY_A, json!({})).await;
    let made = h.post(&format!("/v1/sandboxes/{id}/files/mkdir"), KEY_A, json!({"path": "/workspace/src"})).await;
    assert_eq!(made.status, 204, "{}", made.text());
    assert_eq!(
        h.put(&format!("/v1/sandboxes/{id}/files?path=/workspace/src/a.txt"), KEY_A, b"alpha").await.status,
        204
    );
    assert_eq!(h.put(&format!("/v1/sandboxes/{id}/files?path=/tmp/t"), KEY_A, b"in tmp").await.status, 204);
    id
}

async fn read(h: &Harness, id: &str, path: &str) -> String {
    h.get(&format!("/v1/sandboxes/{id}/files?path={path}"), KEY_A).await.text()
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() { found.extend(files_under(&path)) } else { found.push(path) }
    }
    found
}

fn chunk_files(h: &Harness) -> Vec<std::path::PathBuf> {
    files_under(&h.snapshot_dir.path().join("chunks"))
}

#[tokio::test]
async fn a_snapshot_is_taken_listed_restored_and_deleted_with_its_chunks() {
    let h = Harness::new();
    let source = sandbox_with_files(&h).await;
    let taken = h.post(&format!("/v1/sandboxes/{source}/snapshots"), KEY_A, json!({"name": "before the fix"})).await;
    assert_eq!(taken.status, 201, "{}", taken.text());
    let body = taken.json();
    let id = body["snapshot_id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("sn-") && id.len() == 19, "{id}");
    assert_eq!((body["state"].as_str(), body["sandbox_id"].as_str()), (Some("ready"), Some(source.as_str())));
    assert_eq!((body["name"].as_str(), body["memory"].as_bool()), (Some("before the fix"), Some(false)));
    assert!(body["size_bytes"].as_u64().unwrap() > 0 && body["stored_bytes"].as_u64().unwrap() > 0, "{body}");
    assert_eq!(body["dirs"], json!(["/workspace", "/tmp", "/dev/shm"]));
    assert_eq!(h.get(&format!("/v1/snapshots/{id}"), KEY_A).await.json(), body);
    let listed = h.get("/v1/snapshots", KEY_A).await.json();
    assert_eq!(listed["snapshots"], json!([body]));
    assert_eq!(h.get("/v1/snapshots", KEY_B).await.json()["snapshots"], json!([]), "another tenant sees none");
    h.get(&format!("/v1/snapshots/{id}"), KEY_B).await.assert_error(404, "not_found");

    // The source changes on; the restored copy has the files as they were.
    h.put(&format!("/v1/sandboxes/{source}/files?path=/workspace/src/a.txt"), KEY_A, b"changed").await;
    let restored = h.post("/v1/sandboxes", KEY_A, json!({"snapshot": id})).await;
    assert_eq!(restored.status, 201, "{}", restored.text());
    let copy = restored.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(read(&h, &copy, "/workspace/src/a.txt").await, "alpha");
    assert_eq!(read(&h, &copy, "/tmp/t").await, "in tmp");
    assert_eq!(read(&h, &source, "/workspace/src/a.txt").await, "changed");

    assert!(!chunk_files(&h).is_empty());
    assert_eq!(h.delete(&format!("/v1/snapshots/{id}"), KEY_A).await.status, 204);
    assert!(chunk_files(&h).is_empty(), "the deleted snapshot's chunks are left: {:?}", chunk_files(&h));
    h.get(&format!("/v1/snapshots/{id}"), KEY_A).await.assert_error(404, "not_found");
    h.delete(&format!("/v1/snapshots/{id}"), KEY_A).await.assert_error(404, "not_found");
    let message = h.post("/v1/sandboxes", KEY_A, json!({"snapshot": id})).await.assert_error(404, "not_found");
    assert!(message.contains(&id), "{message}");
}

#[tokio::test]
async fn bad_snapshot_requests_are_refused_with_what_to_do_and_change_nothing() {
    let h = Harness::new();
    let source = sandbox_with_files(&h).await;
    let path = format!("/v1/sandboxes/{source}/snapshots");
    let message = h.post(&path, KEY_A, json!({"memory": true})).await.assert_error(409, "conflict");
    assert!(message.contains("\"memory\": false"), "{message}");
    h.post(&path, KEY_A, json!({"name": "x".repeat(129)})).await.assert_error(422, "unprocessable");
    h.post(&path, KEY_A, json!({"colour": "red"})).await.assert_error(422, "unprocessable");
    h.post(&path, KEY_B, json!({})).await.assert_error(404, "not_found");
    h.post("/v1/sandboxes", KEY_A, json!({"snapshot": "sn-0000000000000000"})).await.assert_error(404, "not_found");
    h.post("/v1/sandboxes", KEY_A, json!({"snapshot": "not-an-id"})).await.assert_error(404, "not_found");
    assert_eq!(h.get("/v1/snapshots", KEY_A).await.json()["snapshots"], json!([]));

    let taken = h.post(&path, KEY_A, json!({})).await.json();
    let id = taken["snapshot_id"].as_str().unwrap();
    // Another tenant cannot restore it; another template cannot hold its files.
    h.post("/v1/sandboxes", KEY_B, json!({"snapshot": id})).await.assert_error(404, "not_found");
    let message = h
        .post("/v1/sandboxes", KEY_A, json!({"snapshot": id, "template": "e2b"}))
        .await
        .assert_error(422, "unprocessable");
    assert!(message.contains("template"), "{message}");
    // A snapshot of a deleted sandbox cannot be taken; its snapshots stay.
    h.delete(&format!("/v1/sandboxes/{source}"), KEY_A).await;
    h.post(&path, KEY_A, json!({})).await.assert_error(409, "conflict");
    assert_eq!(h.get("/v1/snapshots", KEY_A).await.json()["snapshots"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn a_damaged_chunk_makes_the_restore_fail_naming_the_snapshot_and_leaves_no_sandbox() {
    let h = Harness::new();
    let source = sandbox_with_files(&h).await;
    let taken = h.post(&format!("/v1/sandboxes/{source}/snapshots"), KEY_A, json!({})).await.json();
    let id = taken["snapshot_id"].as_str().unwrap();
    for chunk in chunk_files(&h) {
        let mut bytes = std::fs::read(&chunk).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x55;
        std::fs::write(&chunk, bytes).unwrap();
    }
    let before: Vec<Value> =
        h.get("/v1/sandboxes?state=all", KEY_A).await.json()["sandboxes"].as_array().unwrap().clone();
    let message = h.post("/v1/sandboxes", KEY_A, json!({"snapshot": id})).await.assert_error(409, "conflict");
    assert!(message.contains(id) && message.contains("damaged"), "{message}");
    let after: Vec<Value> =
        h.get("/v1/sandboxes?state=all", KEY_A).await.json()["sandboxes"].as_array().unwrap().clone();
    assert_eq!(after, before, "the failed restore left a sandbox row");
    assert_eq!(h.runtime.ids().len(), 1, "the failed restore left a sandbox in the runtime");
}

#[tokio::test]
async fn a_snapshot_over_the_stored_bytes_quota_is_429_and_nothing_is_kept() {
    let mut config = test_config();
    config.tenants = vec![tenant("alpha", KEY_A, 3, 1 << 30)];
    config.tenants[0].max_snapshot_bytes = 10;
    let h = Harness::with_config(config);
    let source = sandbox_with_files(&h).await;
    let message = h
        .post(&format!("/v1/sandboxes/{source}/snapshots"), KEY_A, json!({}))
        .await
        .assert_error(429, "quota_exceeded");
    assert!(message.contains("max_snapshot_bytes"), "{message}");
    assert_eq!(h.get("/v1/snapshots", KEY_A).await.json()["snapshots"], json!([]));
    assert!(chunk_files(&h).is_empty(), "the refused snapshot's chunks are left");
    assert!(files_under(&h.snapshot_dir.path().join("manifests")).is_empty());
}

#[tokio::test]
async fn a_fork_copies_the_files_into_each_copy_and_bad_counts_are_422() {
    let h = Harness::new();
    let source = sandbox_with_files(&h).await;
    let forked = h.post(&format!("/v1/sandboxes/{source}/fork"), KEY_A, json!({"count": 2})).await;
    assert_eq!(forked.status, 201, "{}", forked.text());
    let copies = forked.json()["sandboxes"].as_array().unwrap().clone();
    assert_eq!(copies.len(), 2);
    for copy in &copies {
        let copy = copy["id"].as_str().unwrap();
        assert_eq!(read(&h, copy, "/workspace/src/a.txt").await, "alpha");
    }
    // alpha may run 3: the source and two copies; one more copy does not fit, and none is kept.
    h.post(&format!("/v1/sandboxes/{source}/fork"), KEY_A, json!({"count": 1}))
        .await
        .assert_error(429, "quota_exceeded");
    assert_eq!(h.runtime.ids().len(), 3);
    for count in [0, 17] {
        h.post(&format!("/v1/sandboxes/{source}/fork"), KEY_A, json!({"count": count}))
            .await
            .assert_error(422, "unprocessable");
    }
}
