//! Files API: round trips through the runtime, path checks before the runtime sees a path, size limits enforced
//! while the body streams in.

use axum::body::Body;
use futures::stream;
use serde_json::json;

use crate::harness::{Harness, KEY_A, MAX_FILE_BYTES};

#[tokio::test]
async fn write_read_list_stat_mkdir_rename_remove() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let base = format!("/v1/sandboxes/{id}/files");
    assert_eq!(h.post(&format!("{base}/mkdir"), KEY_A, json!({"path": "/workspace/d"})).await.status, 204);
    assert_eq!(h.put(&format!("{base}?path=/workspace/d/a.bin"), KEY_A, &[0, 1, 2, 255]).await.status, 204);
    let read = h.get(&format!("{base}?path=/workspace/d/a.bin"), KEY_A).await;
    assert_eq!(read.status, 200);
    assert_eq!(read.headers["content-type"], "application/octet-stream");
    assert_eq!(read.body, [0, 1, 2, 255]);
    let list = h.get(&format!("{base}/list?path=/workspace/d"), KEY_A).await.json();
    assert_eq!(list["entries"][0]["name"], "a.bin");
    assert_eq!(list["entries"][0]["kind"], "file");
    let stat = h.get(&format!("{base}/stat?path=/workspace/d/a.bin"), KEY_A).await.json();
    assert_eq!((stat["size"].as_u64(), stat["path"].as_str()), (Some(4), Some("/workspace/d/a.bin")));
    let rename = json!({"from": "/workspace/d/a.bin", "to": "/workspace/b.bin"});
    assert_eq!(h.post(&format!("{base}/rename"), KEY_A, rename).await.status, 204);
    h.get(&format!("{base}?path=/workspace/d/a.bin"), KEY_A).await.assert_error(404, "not_found");
    assert_eq!(h.delete(&format!("{base}?path=/workspace/b.bin"), KEY_A).await.status, 204);
    h.get(&format!("{base}/stat?path=/workspace/b.bin"), KEY_A).await.assert_error(404, "not_found");
}

#[tokio::test]
async fn runtime_failures_map_to_client_errors() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let base = format!("/v1/sandboxes/{id}/files");
    h.put(&format!("{base}?path=/workspace/d/x"), KEY_A, b"x").await.assert_error(404, "not_found");
    h.post(&format!("{base}/mkdir"), KEY_A, json!({"path": "/workspace/d/e", "parents": true})).await;
    h.put(&format!("{base}?path=/workspace/d/e/f"), KEY_A, b"x").await;
    h.delete(&format!("{base}?path=/workspace/d"), KEY_A).await.assert_error(409, "conflict");
    h.post(&format!("{base}/mkdir"), KEY_A, json!({"path": "/workspace/d"})).await.assert_error(409, "conflict");
    h.get(&format!("{base}?path=/workspace/d"), KEY_A).await.assert_error(409, "conflict");
    h.get(&format!("{base}/list?path=/workspace/d/e/f"), KEY_A).await.assert_error(409, "conflict");
    assert_eq!(h.delete(&format!("{base}?path=/workspace/d&recursive=true"), KEY_A).await.status, 204);
}

#[tokio::test]
async fn oversized_upload_is_413_by_content_length_and_while_streaming() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let uri = format!("/v1/sandboxes/{id}/files?path=/workspace/big");
    let too_big = vec![b'x'; MAX_FILE_BYTES as usize + 1];
    let message = h.put(&uri, KEY_A, &too_big).await.assert_error(413, "payload_too_large");
    assert!(message.contains(&MAX_FILE_BYTES.to_string()), "{message}");
    // No Content-Length: chunks arrive one by one; the server stops at the first chunk past the limit and never
    // reads the rest (which would be 1 GiB).
    let chunk = vec![b'y'; 16 << 10];
    let chunks = stream::iter((0..65_536).map(move |_| Ok::<_, std::io::Error>(chunk.clone())));
    let reply = h.call("PUT", &uri, Some(KEY_A), Body::from_stream(chunks)).await;
    reply.assert_error(413, "payload_too_large");
    h.get(&uri.replace("files?", "files/stat?"), KEY_A).await.assert_error(404, "not_found");
    // Exactly the limit is fine.
    assert_eq!(h.put(&uri, KEY_A, &too_big[1..]).await.status, 204);
}

#[tokio::test]
async fn bad_paths_never_reach_the_runtime() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let base = format!("/v1/sandboxes/{id}/files");
    let long = format!("/{}", "a".repeat(5000));
    for path in ["relative.txt", "/workspace/../etc/passwd", "/workspace/a%00b", "", long.as_str()] {
        for uri in
            [format!("{base}?path={path}"), format!("{base}/list?path={path}"), format!("{base}/stat?path={path}")]
        {
            h.get(&uri, KEY_A).await.assert_error(400, "bad_request");
        }
        h.put(&format!("{base}?path={path}"), KEY_A, b"x").await.assert_error(400, "bad_request");
        h.delete(&format!("{base}?path={path}"), KEY_A).await.assert_error(400, "bad_request");
        let mkdir = json!({"path": path.replace("%00", "\u{0}")});
        h.post(&format!("{base}/mkdir"), KEY_A, mkdir).await.assert_error(400, "bad_request");
        let rename = json!({"from": "/workspace/a", "to": path.replace("%00", "\u{0}")});
        h.post(&format!("{base}/rename"), KEY_A, rename).await.assert_error(400, "bad_request");
    }
}
