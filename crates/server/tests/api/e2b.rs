//! The E2B facade over the fake runtime, on the wire as the SDK sees it: the control plane's JSON and error shapes,
//! the access token on per-sandbox requests, a Connect server stream (start, data, end, end-of-stream), unary
//! Connect errors, `/files` uploads (multipart and octet-stream), downloads and 404s, and network rules.

use axum::body::Body;
use axum::http::StatusCode;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use crate::harness::{Harness, KEY_A, KEY_B, Reply};

struct Opened {
    id: String,
    token: String,
}

async fn control(h: &Harness, method: &str, uri: &str, key: &str, body: Option<Value>) -> Reply {
    let body = body.map_or_else(Body::empty, |json| Body::from(json.to_string()));
    h.call_with(method, uri, None, body, &[("x-api-key", key), ("content-type", "application/json")]).await
}

async fn open(h: &Harness, key: &str, metadata: Value) -> Opened {
    let body = json!({ "templateID": "base", "timeout": 60, "metadata": metadata, "envVars": {"A": "1"} });
    let reply = control(h, "POST", "/v2/sandboxes", key, Some(body)).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
    let json = reply.json();
    for field in ["templateID", "sandboxID", "clientID", "envdVersion", "envdAccessToken", "trafficAccessToken"] {
        assert!(json.get(field).is_some(), "{field} missing: {json}");
    }
    Opened { id: json["sandboxID"].as_str().unwrap().into(), token: json["envdAccessToken"].as_str().unwrap().into() }
}

async fn sandbox_call(h: &Harness, sb: &Opened, method: &str, uri: &str, content_type: &str, body: Vec<u8>) -> Reply {
    let headers =
        [("e2b-sandbox-id", sb.id.as_str()), ("x-access-token", sb.token.as_str()), ("content-type", content_type)];
    h.call_with(method, uri, None, Body::from(body), &headers).await
}

fn envelope(flags: u8, json: &Value) -> Vec<u8> {
    let payload = json.to_string().into_bytes();
    let mut framed = vec![flags];
    framed.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    framed.extend(payload);
    framed
}

fn envelopes(mut body: &[u8]) -> Vec<(u8, Value)> {
    let mut found = Vec::new();
    while !body.is_empty() {
        let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        found.push((body[0], serde_json::from_slice(&body[5..5 + length]).unwrap()));
        body = &body[5 + length..];
    }
    found
}

#[tokio::test]
async fn control_plane_speaks_e2b_json() {
    let h = Harness::new();
    let wrong =
        control(&h, "POST", "/v2/sandboxes", "e2b_not-a-configured-key-000", Some(json!({"templateID": "base"}))).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_eq!(wrong.json()["code"], 401);
    let unknown = control(&h, "POST", "/v2/sandboxes", KEY_A, Some(json!({"templateID": "gpu-9000"}))).await;
    assert_eq!((unknown.status, unknown.json()["code"].clone()), (StatusCode::NOT_FOUND, json!(404)));

    let sb = open(&h, KEY_A, json!({"team": "x"})).await;
    open(&h, KEY_A, json!({"team": "y"})).await;
    let listed = control(&h, "GET", "/v2/sandboxes?metadata=team%3Dx", KEY_A, None).await.json();
    let ids: Vec<&str> = listed.as_array().unwrap().iter().map(|s| s["sandboxID"].as_str().unwrap()).collect();
    assert_eq!(ids, vec![sb.id.as_str()]);
    assert_eq!(listed[0]["state"], "running");
    let paged = control(&h, "GET", "/v2/sandboxes?limit=1", KEY_A, None).await;
    assert_eq!(paged.json().as_array().unwrap().len(), 1);
    assert!(paged.headers.get("x-next-token").is_some(), "{:?}", paged.headers);
    // Another tenant sees none of them.
    assert_eq!(control(&h, "GET", "/v2/sandboxes", KEY_B, None).await.json(), json!([]));
    assert_eq!(control(&h, "GET", &format!("/sandboxes/{}", sb.id), KEY_B, None).await.status, StatusCode::NOT_FOUND);

    let info = control(&h, "GET", &format!("/sandboxes/{}", sb.id), KEY_A, None).await.json();
    assert_eq!(
        (info["templateID"].as_str(), info["envdAccessToken"].as_str()),
        (Some("base"), Some(sb.token.as_str()))
    );
    let uri = format!("/sandboxes/{}/timeout", sb.id);
    let timeout = control(&h, "POST", &uri, KEY_A, Some(json!({"timeout": 600}))).await;
    assert_eq!(timeout.status, StatusCode::NO_CONTENT);
    let later = control(&h, "GET", &format!("/sandboxes/{}", sb.id), KEY_A, None).await.json();
    assert!(later["endAt"].as_str() > info["endAt"].as_str());
    let uri = format!("/v2/sandboxes/{}/connect", sb.id);
    let connected = control(&h, "POST", &uri, KEY_A, Some(json!({"timeout": 10}))).await;
    assert_eq!(connected.json()["envdAccessToken"].as_str(), Some(sb.token.as_str()));
    let pause = format!("/sandboxes/{}/pause", sb.id);
    let bad = control(&h, "POST", &pause, KEY_A, Some(json!({"memory": "no"}))).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "a malformed pause body is refused, not ignored");
    assert!(bad.json()["message"].as_str().is_some_and(|m| m.contains("memory")), "{}", bad.text());
    assert_eq!(control(&h, "POST", &pause, KEY_A, None).await.status, StatusCode::NO_CONTENT);
    let again = control(&h, "POST", &pause, KEY_A, None).await;
    assert_eq!((again.status, again.json()["code"].clone()), (StatusCode::CONFLICT, json!(409)), "paused already");
    let paused = control(&h, "GET", &format!("/sandboxes/{}", sb.id), KEY_A, None).await.json();
    assert_eq!(paused["state"], "paused");
    let filesystem_only = control(&h, "POST", &pause, KEY_A, Some(json!({"memory": false}))).await;
    assert_eq!(filesystem_only.status, StatusCode::CONFLICT, "paused already, whatever the mode");
    let resumed = control(&h, "POST", &format!("/sandboxes/{}/resume", sb.id), KEY_A, None).await;
    assert_eq!(resumed.status, StatusCode::CREATED);
    assert_eq!(
        control(&h, "POST", &format!("/sandboxes/{}/resume", sb.id), KEY_A, None).await.status,
        StatusCode::CONFLICT
    );
    // Filesystem only: released in the runtime, made again by the resume under the same id and token.
    let filesystem_only = control(&h, "POST", &pause, KEY_A, Some(json!({"memory": false}))).await;
    assert_eq!(filesystem_only.status, StatusCode::NO_CONTENT, "{}", filesystem_only.text());
    assert!(!h.runtime.is_alive_here(&sb.id));
    let connected = control(&h, "POST", &uri, KEY_A, Some(json!({"timeout": 10}))).await;
    assert_eq!(connected.status, StatusCode::OK, "{}", connected.text());
    assert_eq!(connected.json()["envdAccessToken"].as_str(), Some(sb.token.as_str()));
    assert!(h.runtime.is_alive_here(&sb.id), "connect resumed it");

    assert_eq!(
        control(&h, "DELETE", &format!("/sandboxes/{}", sb.id), KEY_A, None).await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        control(&h, "DELETE", &format!("/sandboxes/{}", sb.id), KEY_A, None).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(control(&h, "GET", &format!("/sandboxes/{}", sb.id), KEY_A, None).await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_process_streams_start_output_and_exit_code() {
    let h = Harness::new();
    let sb = open(&h, KEY_A, json!({})).await;
    let start = json!({ "process": { "cmd": "steps", "args": ["out:hello", "err:oops", "exit:3"] } });
    let reply =
        sandbox_call(&h, &sb, "POST", "/process.Process/Start", "application/connect+json", envelope(0, &start)).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.headers.get("content-type").unwrap(), "application/connect+json");
    let messages = envelopes(&reply.body);
    assert!(messages[0].1["event"]["start"]["pid"].as_u64().is_some(), "{messages:?}");
    let decode = |stream: &str| -> String {
        let bytes: Vec<u8> = messages
            .iter()
            .filter_map(|(_, m)| m["event"]["data"][stream].as_str())
            .flat_map(|data| STANDARD.decode(data).unwrap())
            .collect();
        String::from_utf8(bytes).unwrap()
    };
    assert_eq!((decode("stdout"), decode("stderr")), ("hello".to_owned(), "oops".to_owned()));
    let (end_flags, end) = messages.last().unwrap();
    assert_eq!((*end_flags, end), (2, &json!({})));
    let exit = &messages[messages.len() - 2].1["event"]["end"];
    assert_eq!((exit["exitCode"].as_i64(), exit["exited"].as_bool()), (Some(3), Some(true)));

    // Unary calls: an unknown pid is a Connect not_found.
    let body = json!({ "process": { "pid": 999_999 }, "signal": "SIGNAL_SIGKILL" }).to_string().into_bytes();
    let signal = sandbox_call(&h, &sb, "POST", "/process.Process/SendSignal", "application/json", body).await;
    assert_eq!((signal.status, signal.json()["code"].clone()), (StatusCode::NOT_FOUND, json!("not_found")));
}

#[tokio::test]
async fn a_pty_process_sends_pty_data_resizes_and_refuses_oversized_terminals() {
    let h = Harness::new();
    let sb = open(&h, KEY_A, json!({})).await;
    let start = |body: Value| {
        let (h, sb) = (&h, &sb);
        async move {
            let reply =
                sandbox_call(h, sb, "POST", "/process.Process/Start", "application/connect+json", envelope(0, &body))
                    .await;
            envelopes(&reply.body)
        }
    };
    let messages = start(
        json!({ "process": { "cmd": "steps", "args": ["out:hello"] }, "pty": { "size": { "cols": 80, "rows": 24 } } }),
    )
    .await;
    let pty: Vec<u8> = messages
        .iter()
        .filter_map(|(_, m)| m["event"]["data"]["pty"].as_str())
        .flat_map(|data| STANDARD.decode(data).unwrap())
        .collect();
    assert_eq!(pty, b"hello", "a terminal's output is pty data: {messages:?}");
    assert!(messages.iter().all(|(_, m)| m["event"]["data"]["stdout"].is_null()), "{messages:?}");

    // Zero is a terminal of unknown size (as envd takes it); past 1000 is invalid_argument.
    let zero = start(json!({ "process": { "cmd": "steps" }, "pty": { "size": {} } })).await;
    assert!(zero[0].1["event"]["start"]["pid"].as_u64().is_some(), "{zero:?}");
    let huge =
        start(json!({ "process": { "cmd": "steps" }, "pty": { "size": { "cols": 100_000, "rows": 24 } } })).await;
    assert_eq!(huge.len(), 1);
    assert_eq!(huge[0].1["error"]["code"], "invalid_argument", "{huge:?}");
    assert!(huge[0].1["error"]["message"].as_str().unwrap().contains("cols must be at most 1000"), "{huge:?}");

    // A terminal that runs on (started natively; the fake gives every command pid 100, the newest running wins).
    let exec = format!("/v1/sandboxes/{}/exec", sb.id);
    let body = json!({"argv": ["sleep-ms", "60000"], "background": true, "pty": {"cols": 80, "rows": 24}});
    assert_eq!(h.post(&exec, KEY_A, body).await.status, StatusCode::ACCEPTED);
    let update = |body: Value| {
        let (h, sb) = (&h, &sb);
        async move {
            sandbox_call(h, sb, "POST", "/process.Process/Update", "application/json", body.to_string().into_bytes())
                .await
        }
    };
    let resized = update(json!({ "process": { "pid": 100 }, "pty": { "size": { "cols": 120, "rows": 40 } } })).await;
    assert_eq!(resized.status, StatusCode::OK, "{}", resized.text());
    let oversized = update(json!({ "process": { "pid": 100 }, "pty": { "size": { "cols": 80, "rows": 5000 } } })).await;
    assert_eq!(oversized.json()["code"], "invalid_argument", "{}", oversized.text());
    let unknown = update(json!({ "process": { "pid": 999_999 }, "pty": { "size": { "cols": 80, "rows": 24 } } })).await;
    assert_eq!(unknown.json()["code"], "not_found", "{}", unknown.text());
    let input = json!({ "process": { "pid": 100 }, "input": { "pty": STANDARD.encode("ls\n") } });
    let sent =
        sandbox_call(&h, &sb, "POST", "/process.Process/SendInput", "application/json", input.to_string().into_bytes())
            .await;
    assert_eq!(sent.status, StatusCode::OK, "{}", sent.text());
}

#[tokio::test]
async fn per_sandbox_requests_need_the_token_and_a_running_sandbox() {
    let h = Harness::new();
    let sb = open(&h, KEY_A, json!({})).await;
    let stat = json!({ "path": "/tmp" }).to_string().into_bytes();
    let ok = sandbox_call(&h, &sb, "POST", "/filesystem.Filesystem/Stat", "application/json", stat.clone()).await;
    assert_eq!(ok.json()["entry"]["type"], "FILE_TYPE_DIRECTORY", "{}", ok.text());

    let forged = Opened { id: sb.id.clone(), token: "0".repeat(64) };
    let refused =
        sandbox_call(&h, &forged, "POST", "/filesystem.Filesystem/Stat", "application/json", stat.clone()).await;
    assert_eq!((refused.status, refused.json()["code"].clone()), (StatusCode::UNAUTHORIZED, json!("unauthenticated")));
    let health = sandbox_call(&h, &sb, "GET", "/health", "text/plain", Vec::new()).await;
    assert_eq!(health.status, StatusCode::NO_CONTENT);

    // Ended through the native API: the facade's session goes too.
    assert_eq!(h.delete(&format!("/v1/sandboxes/{}", sb.id), KEY_A).await.status, StatusCode::NO_CONTENT);
    let gone = sandbox_call(&h, &sb, "POST", "/filesystem.Filesystem/Stat", "application/json", stat).await;
    assert_eq!(gone.status, StatusCode::BAD_GATEWAY);
    assert_eq!(gone.json()["code"], "unavailable");
    assert!(gone.json()["message"].as_str().unwrap().contains("was not found"), "{}", gone.text());
    let health = sandbox_call(&h, &sb, "GET", "/health", "text/plain", Vec::new()).await;
    assert_eq!(health.status, StatusCode::BAD_GATEWAY);
    assert!(health.json()["message"].as_str().unwrap().contains("was not found"), "the SDK's probe reads it");
    // The facade's errors are counted like the native API's, under their Connect code names.
    let metrics = h.call("GET", "/metrics", None, Body::empty()).await.text();
    assert!(metrics.contains("sandkasten_errors_total{code=\"unauthenticated\"} 1"), "{metrics}");
    assert!(metrics.contains("sandkasten_errors_total{code=\"unavailable\"} 2"), "{metrics}");
}

#[tokio::test]
async fn files_upload_download_and_filesystem_calls() {
    let h = Harness::new();
    let sb = open(&h, KEY_A, json!({})).await;
    let multipart = "--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/a/b.txt\"\r\n\
        Content-Type: application/octet-stream\r\n\r\nmultipart body\r\n--XX--\r\n";
    let uploaded =
        sandbox_call(&h, &sb, "POST", "/files", "multipart/form-data; boundary=XX", multipart.as_bytes().to_vec())
            .await;
    assert_eq!(uploaded.status, StatusCode::OK, "{}", uploaded.text());
    assert_eq!(uploaded.json(), json!([{ "name": "b.txt", "type": "file", "path": "/home/user/a/b.txt" }]));
    let raw = sandbox_call(&h, &sb, "POST", "/files?path=rel.bin", "application/octet-stream", vec![0, 159, 255]).await;
    assert_eq!(raw.json()[0]["path"], "/home/user/rel.bin");

    let read = sandbox_call(&h, &sb, "GET", "/files?path=%2Fhome%2Fuser%2Fa%2Fb.txt", "text/plain", Vec::new()).await;
    assert_eq!(read.body, b"multipart body");
    let binary = sandbox_call(&h, &sb, "GET", "/files?path=rel.bin", "text/plain", Vec::new()).await;
    assert_eq!(binary.body, vec![0, 159, 255]);
    let missing = sandbox_call(&h, &sb, "GET", "/files?path=nope.txt", "text/plain", Vec::new()).await;
    assert_eq!((missing.status, missing.json()["code"].clone()), (StatusCode::NOT_FOUND, json!(404)));

    let list = json!({ "path": "/home/user", "depth": 2 }).to_string().into_bytes();
    let listed = sandbox_call(&h, &sb, "POST", "/filesystem.Filesystem/ListDir", "application/json", list).await.json();
    let mut paths: Vec<&str> =
        listed["entries"].as_array().unwrap().iter().map(|e| e["path"].as_str().unwrap()).collect();
    paths.sort_unstable();
    assert_eq!(paths, vec!["/home/user/a", "/home/user/a/b.txt", "/home/user/rel.bin"]);
    let mkdir = json!({ "path": "/home/user/a" }).to_string().into_bytes();
    let exists = sandbox_call(&h, &sb, "POST", "/filesystem.Filesystem/MakeDir", "application/json", mkdir).await;
    assert_eq!((exists.status, exists.json()["code"].clone()), (StatusCode::CONFLICT, json!("already_exists")));
}

#[tokio::test]
async fn execute_streams_lines_and_an_unknown_context_is_404() {
    let h = Harness::new();
    let sb = open(&h, KEY_A, json!({})).await;
    let body = json!({ "code": "1 + 1", "language": "python" }).to_string().into_bytes();
    let reply = sandbox_call(&h, &sb, "POST", "/execute", "application/json", body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let lines: Vec<Value> = reply.text().lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    let kinds: Vec<&str> = lines.iter().map(|line| line["type"].as_str().unwrap()).collect();
    assert_eq!(kinds.last(), Some(&"end_of_execution"), "{lines:?}");
    assert!(kinds.contains(&"number_of_executions"), "{lines:?}");

    let unknown = json!({ "code": "1", "context_id": "ctx-0123456789abcdef" }).to_string().into_bytes();
    let reply = sandbox_call(&h, &sb, "POST", "/execute", "application/json", unknown).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.text());
    let created = sandbox_call(&h, &sb, "POST", "/contexts", "application/json", b"{}".to_vec()).await.json();
    assert_eq!((created["language"].as_str(), created["cwd"].as_str()), (Some("python"), Some("/home/user")));
    let listed = sandbox_call(&h, &sb, "GET", "/contexts", "application/json", Vec::new()).await.json();
    assert!(listed.as_array().unwrap().iter().any(|c| c["id"] == created["id"]), "{listed}");
}

/// A facade sandbox of tenant A with `/home/user/a.txt` holding `text` (written through the native API).
async fn with_file(h: &Harness, text: &[u8]) -> Opened {
    let sb = open(h, KEY_A, json!({})).await;
    let home = json!({"path": "/home/user", "parents": true});
    let made = h.post(&format!("/v1/sandboxes/{}/files/mkdir", sb.id), KEY_A, home).await;
    assert_eq!(made.status, StatusCode::NO_CONTENT, "{}", made.text());
    let written = h.put(&format!("/v1/sandboxes/{}/files?path=/home/user/a.txt", sb.id), KEY_A, text).await;
    assert_eq!(written.status, StatusCode::NO_CONTENT, "{}", written.text());
    sb
}

async fn read_a(h: &Harness, id: &str) -> String {
    h.get(&format!("/v1/sandboxes/{id}/files?path=/home/user/a.txt"), KEY_A).await.text()
}

fn chunk_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() { found.extend(chunk_files(&path)) } else { found.push(path) }
    }
    found
}

#[tokio::test]
async fn a_full_snapshot_is_refused_naming_the_filesystem_mode_and_nothing_is_taken() {
    let h = Harness::new();
    let sb = with_file(&h, b"alpha").await;
    let uri = format!("/sandboxes/{}/snapshots", sb.id);
    // The SDK sends no `memory` for its default mode ("full"), and `true` for mode="full".
    for body in [json!({}), json!({"memory": true})] {
        let refused = control(&h, "POST", &uri, KEY_A, Some(body)).await;
        assert_eq!((refused.status, refused.json()["code"].clone()), (StatusCode::BAD_REQUEST, json!(400)));
        let message = refused.json()["message"].as_str().unwrap().to_owned();
        assert!(message.contains("mode=\"filesystem\""), "{message}");
    }
    assert_eq!(control(&h, "GET", "/snapshots", KEY_A, None).await.json(), json!([]));
    assert!(chunk_files(&h.snapshot_dir.path().join("chunks")).is_empty(), "a refused snapshot stored chunks");
    let unknown =
        control(&h, "POST", "/sandboxes/sb-0123456789abcdef/snapshots", KEY_A, Some(json!({"memory": false})));
    assert_eq!(unknown.await.status, StatusCode::NOT_FOUND);
    let long = control(&h, "POST", &uri, KEY_A, Some(json!({"memory": false, "name": "x".repeat(129)}))).await;
    assert_eq!(long.status, StatusCode::BAD_REQUEST, "{}", long.text());
}

#[tokio::test]
async fn filesystem_snapshots_are_listed_restored_by_create_and_deleted_as_templates() {
    let h = Harness::new();
    let sb = with_file(&h, b"alpha").await;
    let uri = format!("/sandboxes/{}/snapshots", sb.id);
    let taken = control(&h, "POST", &uri, KEY_A, Some(json!({"memory": false, "name": "before"}))).await;
    assert_eq!(taken.status, StatusCode::CREATED, "{}", taken.text());
    let info = taken.json();
    let id = info["snapshotID"].as_str().unwrap().to_owned();
    assert!(id.starts_with("sn-") && id.len() == 19, "{info}");
    assert_eq!(info, json!({"snapshotID": id, "names": ["before"]}));
    // A later creation time (ms), so the order below is the creation order.
    tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    let unnamed = control(&h, "POST", &uri, KEY_A, Some(json!({"memory": false}))).await.json();
    assert_eq!(unnamed["names"], json!([]));

    // Listing: the SDK's filters and paging, newest first as E2B lists them, by cursor.
    let all = control(&h, "GET", "/snapshots", KEY_A, None).await.json();
    assert_eq!(all, json!([unnamed, info]));
    let paged = control(&h, "GET", "/snapshots?limit=1", KEY_A, None).await;
    assert_eq!(paged.json(), json!([unnamed]));
    let token = paged.headers.get("x-next-token").unwrap().to_str().unwrap().to_owned();
    let rest = control(&h, "GET", &format!("/snapshots?limit=1&nextToken={token}"), KEY_A, None).await;
    assert_eq!((rest.json(), rest.headers.get("x-next-token")), (json!([info]), None));
    for (query, words) in
        [("limit=0", "at least 1"), ("limit=101", "at most 100"), ("nextToken=1", "Invalid next token")]
    {
        let refused = control(&h, "GET", &format!("/snapshots?{query}"), KEY_A, None).await;
        assert_eq!((refused.status, refused.json()["code"].clone()), (StatusCode::BAD_REQUEST, json!(400)), "{query}");
        assert!(refused.json()["message"].as_str().unwrap().contains(words), "{query}: {}", refused.text());
    }
    assert_eq!(control(&h, "GET", "/snapshots?name=before", KEY_A, None).await.json(), json!([info]));
    let by_source = format!("/snapshots?sandboxID={}", sb.id);
    assert_eq!(control(&h, "GET", &by_source, KEY_A, None).await.json().as_array().unwrap().len(), 2);
    let other_source = "/snapshots?sandboxID=sb-0123456789abcdef";
    assert_eq!(control(&h, "GET", other_source, KEY_A, None).await.json(), json!([]));

    // Another tenant's snapshot is not found: not listed, not a template, not deletable.
    assert_eq!(control(&h, "GET", "/snapshots", KEY_B, None).await.json(), json!([]));
    let foreign = control(&h, "POST", "/v2/sandboxes", KEY_B, Some(json!({"templateID": id}))).await;
    assert_eq!((foreign.status, foreign.json()["code"].clone()), (StatusCode::NOT_FOUND, json!(404)));
    let template = format!("/templates/{id}");
    assert_eq!(control(&h, "DELETE", &template, KEY_B, None).await.status, StatusCode::NOT_FOUND);

    // Sandbox.create(snapshot_id): the source changes on, the new sandbox has the files as they were.
    h.put(&format!("/v1/sandboxes/{}/files?path=/home/user/a.txt", sb.id), KEY_A, b"changed").await;
    let restored = control(&h, "POST", "/v2/sandboxes", KEY_A, Some(json!({"templateID": id, "timeout": 60}))).await;
    assert_eq!(restored.status, StatusCode::CREATED, "{}", restored.text());
    assert_eq!(restored.json()["templateID"], json!(id));
    let copy = restored.json()["sandboxID"].as_str().unwrap().to_owned();
    assert_eq!(read_a(&h, &copy).await, "alpha");
    assert_eq!(read_a(&h, &sb.id).await, "changed");

    // Sandbox.delete_snapshot: DELETE /templates/{id}; then it is gone everywhere.
    assert_eq!(control(&h, "DELETE", &template, KEY_A, None).await.status, StatusCode::NO_CONTENT);
    assert_eq!(control(&h, "DELETE", &template, KEY_A, None).await.status, StatusCode::NOT_FOUND);
    assert_eq!(control(&h, "GET", "/snapshots", KEY_A, None).await.json(), json!([unnamed]));
    let deleted = control(&h, "POST", "/v2/sandboxes", KEY_A, Some(json!({"templateID": id}))).await;
    assert_eq!(deleted.status, StatusCode::NOT_FOUND, "{}", deleted.text());
    let builtin = control(&h, "DELETE", "/templates/base", KEY_A, None).await;
    assert_eq!(builtin.status, StatusCode::BAD_REQUEST, "{}", builtin.text());
    let unknown = control(&h, "DELETE", "/templates/no-such-template", KEY_A, None).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);

    // A snapshot of a native sandbox (another template, another home) is the native API's to restore.
    let native = h.create(KEY_A, json!({})).await;
    let taken = h.post(&format!("/v1/sandboxes/{native}/snapshots"), KEY_A, json!({})).await.json();
    let body = json!({"templateID": taken["snapshot_id"]});
    let refused = control(&h, "POST", "/v2/sandboxes", KEY_A, Some(body)).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.text());
    assert!(refused.json()["message"].as_str().unwrap().contains("POST /v1/sandboxes"), "{}", refused.text());
}

#[tokio::test]
async fn a_create_from_a_damaged_snapshot_fails_and_leaves_no_sandbox() {
    let h = Harness::new();
    let sb = with_file(&h, b"alpha").await;
    let uri = format!("/sandboxes/{}/snapshots", sb.id);
    let taken = control(&h, "POST", &uri, KEY_A, Some(json!({"memory": false}))).await.json();
    for chunk in chunk_files(&h.snapshot_dir.path().join("chunks")) {
        let mut bytes = std::fs::read(&chunk).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x55;
        std::fs::write(&chunk, bytes).unwrap();
    }
    let body = json!({"templateID": taken["snapshotID"]});
    let refused = control(&h, "POST", "/v2/sandboxes", KEY_A, Some(body)).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.text());
    assert!(refused.json()["message"].as_str().unwrap().contains("damaged"), "{}", refused.text());
    assert_eq!(h.runtime.ids().len(), 1, "the failed restore left a sandbox in the runtime");
    let listed = control(&h, "GET", "/v2/sandboxes", KEY_A, None).await.json();
    assert_eq!(listed.as_array().unwrap().len(), 1, "the failed restore left a sandbox: {listed}");
}

#[tokio::test]
async fn fork_gives_independent_copies_the_sdk_can_connect_to() {
    let h = Harness::new();
    let sb = with_file(&h, b"alpha").await;
    let uri = format!("/sandboxes/{}/fork", sb.id);
    let forked = control(&h, "POST", &uri, KEY_A, Some(json!({"count": 2, "timeout": 60}))).await;
    assert_eq!(forked.status, StatusCode::CREATED, "{}", forked.text());
    let results = forked.json();
    let copies: Vec<Opened> = results
        .as_array()
        .unwrap()
        .iter()
        .map(|result| {
            let sandbox = &result["sandbox"];
            for field in ["templateID", "sandboxID", "clientID", "envdVersion", "envdAccessToken"] {
                assert!(sandbox.get(field).is_some(), "{field} missing: {result}");
            }
            assert!(result.get("error").is_none(), "{result}");
            Opened {
                id: sandbox["sandboxID"].as_str().unwrap().into(),
                token: sandbox["envdAccessToken"].as_str().unwrap().into(),
            }
        })
        .collect();
    assert_eq!(copies.len(), 2);
    assert!(copies[0].id != copies[1].id && copies.iter().all(|copy| copy.id != sb.id));
    for copy in &copies {
        assert_eq!(read_a(&h, &copy.id).await, "alpha");
        // Each copy's token opens its envd: the SDK's handle works.
        let stat = json!({ "path": "/home/user/a.txt" }).to_string().into_bytes();
        let reply = sandbox_call(&h, copy, "POST", "/filesystem.Filesystem/Stat", "application/json", stat).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }
    h.put(&format!("/v1/sandboxes/{}/files?path=/home/user/a.txt", copies[0].id), KEY_A, b"first").await;
    assert_eq!((read_a(&h, &copies[1].id).await, read_a(&h, &sb.id).await), ("alpha".into(), "alpha".into()));

    // An omitted count is one copy (room made first: the test tenant may run three); out of range is 400 and makes
    // none.
    let killed = control(&h, "DELETE", &format!("/sandboxes/{}", copies[1].id), KEY_A, None).await;
    assert_eq!(killed.status, StatusCode::NO_CONTENT);
    let one = control(&h, "POST", &uri, KEY_A, Some(json!({}))).await;
    assert_eq!((one.status, one.json().as_array().map(Vec::len)), (StatusCode::CREATED, Some(1)));
    let running = h.runtime.ids().len();
    for count in [0, 17] {
        let refused = control(&h, "POST", &uri, KEY_A, Some(json!({"count": count}))).await;
        assert_eq!((refused.status, refused.json()["code"].clone()), (StatusCode::BAD_REQUEST, json!(400)));
        assert!(refused.json()["message"].as_str().unwrap().contains("count"), "{}", refused.text());
    }
    assert_eq!(h.runtime.ids().len(), running, "a refused fork made sandboxes");
    assert_eq!(control(&h, "POST", &uri, KEY_B, Some(json!({"count": 1}))).await.status, StatusCode::NOT_FOUND);
    let unknown = control(&h, "POST", "/sandboxes/sb-0123456789abcdef/fork", KEY_A, Some(json!({"count": 1})));
    assert_eq!(unknown.await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn metrics_are_the_sandboxs_samples_in_e2b_shape_for_the_callers_sandbox_only() {
    let h = Harness::new();
    let sb = open(&h, KEY_A, json!({})).await;
    let uri = format!("/sandboxes/{}/metrics", sb.id);
    let reply = control(&h, "GET", &uri, KEY_A, None).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let samples = reply.json();
    let sample = &samples.as_array().unwrap()[0];
    for key in ["timestamp", "timestampUnix", "cpuCount", "cpuUsedPct", "memUsed", "memTotal", "memCache", "diskUsed"] {
        assert!(sample.get(key).is_some(), "{key} missing: {sample}");
    }
    assert_eq!(sample["cpuCount"], 1);
    assert_eq!(sample["memUsed"], 1 << 20, "what the runtime read");
    assert_eq!(sample["diskTotal"], 128 << 20);
    assert!(sample["timestamp"].as_str().unwrap().ends_with('Z'), "{sample}");
    // `end` before the sample was taken: none; `start` after `end`: refused.
    let before = sample["timestampUnix"].as_i64().unwrap() - 10;
    let none = control(&h, "GET", &format!("{uri}?end={before}"), KEY_A, None).await;
    assert_eq!(none.json(), json!([]), "{}", none.text());
    let backwards = control(&h, "GET", &format!("{uri}?start=20&end=10"), KEY_A, None).await;
    assert_eq!(backwards.status, StatusCode::BAD_REQUEST, "{}", backwards.text());
    assert_eq!(control(&h, "GET", &uri, KEY_B, None).await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_tenants_scan_policy_refuses_processes_and_cells_in_enforce() {
    let mut config = crate::harness::test_config();
    config.tenants[0].scan = Some(sandkasten_scan::ScanPolicy::from_toml_str("mode = \"enforce\"").unwrap());
    let h = Harness::with_config(config);
    let sb = open(&h, KEY_A, json!({})).await;
    let hostile = json!({ "process": { "cmd": "/bin/bash", "args": ["-l", "-c", "rm -rf / --no-preserve-root"] } });
    let reply =
        sandbox_call(&h, &sb, "POST", "/process.Process/Start", "application/connect+json", envelope(0, &hostile))
            .await;
    let text = reply.text();
    assert!(text.contains("failed_precondition") && text.contains("destructive_command"), "{text}");
    assert!(h.runtime.last_command.lock().unwrap().is_none(), "the refused process reached the runtime");
    let cell = json!({ "code": "import os\nos.system('rm -rf /')", "language": "python" }).to_string().into_bytes();
    let reply = sandbox_call(&h, &sb, "POST", "/execute", "application/json", cell).await;
    assert_ne!(reply.status, StatusCode::OK, "{}", reply.text());
    assert!(reply.text().contains("destructive_command"), "{}", reply.text());
    let clean = json!({ "process": { "cmd": "steps", "args": ["out:ok", "exit:0"] } });
    let reply =
        sandbox_call(&h, &sb, "POST", "/process.Process/Start", "application/connect+json", envelope(0, &clean)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert!(h.runtime.last_command.lock().unwrap().is_some());
}

#[tokio::test]
async fn listing_pages_by_cursor_newest_first_with_e2b_s_filters_and_errors() {
    let h = Harness::new();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(open(&h, KEY_A, json!({"team": "p"})).await.id);
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    let listed = |reply: &Reply| -> Vec<String> {
        reply.json().as_array().unwrap().iter().map(|s| s["sandboxID"].as_str().unwrap().to_owned()).collect()
    };
    let first = control(&h, "GET", "/v2/sandboxes?metadata=team%3Dp&limit=2", KEY_A, None).await;
    assert_eq!(listed(&first), vec![ids[2].clone(), ids[1].clone()], "newest first");
    assert_eq!(first.headers.get("x-total-running").unwrap(), "3");
    let token = first.headers.get("x-next-token").unwrap().to_str().unwrap().to_owned();
    let uri = format!("/v2/sandboxes?metadata=team%3Dp&limit=2&nextToken={token}");
    let last = control(&h, "GET", &uri, KEY_A, None).await;
    assert_eq!(listed(&last), vec![ids[0].clone()]);
    assert!(last.headers.get("x-next-token").is_none(), "the last page has no token");
    let asc = control(&h, "GET", "/v2/sandboxes?metadata=team%3Dp&order=asc", KEY_A, None).await;
    assert_eq!(listed(&asc), ids);
    // startedAfter is inclusive; E2B's startedAt read back is a valid bound.
    let second = control(&h, "GET", &format!("/sandboxes/{}", ids[1]), KEY_A, None).await.json();
    let since = second["startedAt"].as_str().unwrap().replace(':', "%3A");
    let uri = format!("/v2/sandboxes?metadata=team%3Dp&order=asc&startedAfter={since}");
    assert_eq!(listed(&control(&h, "GET", &uri, KEY_A, None).await), ids[1..]);
    let by_template = control(&h, "GET", "/v2/sandboxes?metadata=team%3Dp&template=host", KEY_A, None).await;
    assert_eq!(listed(&by_template), Vec::<String>::new());
    let paused_only = control(&h, "GET", "/v2/sandboxes?state=paused", KEY_A, None).await;
    assert!(paused_only.headers.get("x-total-running").is_none(), "only when running ones were asked for");

    let desc_token = token;
    for (query, words) in [
        ("limit=0", "at least 1"),
        ("limit=101", "at most 100"),
        ("limit=x", "not an integer"),
        ("nextToken=garbage", "Invalid next token"),
        (&*format!("order=asc&nextToken={desc_token}"), "other sort order"),
        ("order=sideways", "Invalid order"),
        ("state=dead", "not one of running, paused"),
        ("startedAfter=yesterday", "startedAfter"),
        ("template=base%3Av1", "tags are not supported"),
    ] {
        let refused = control(&h, "GET", &format!("/v2/sandboxes?{query}"), KEY_A, None).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{query}: {}", refused.text());
        let body = refused.json();
        assert_eq!(body["code"], 400, "{query}: {body}");
        assert!(body["message"].as_str().unwrap().contains(words), "{query}: {body}");
    }
}

#[tokio::test]
async fn a_create_with_metadata_that_is_not_strings_is_a_400_naming_it_and_makes_nothing() {
    let h = Harness::new();
    for metadata in [json!({"k": 1}), json!({"k": ["a"]}), json!(["not", "a", "map"])] {
        let body = json!({ "templateID": "base", "timeout": 60, "metadata": metadata });
        let refused = control(&h, "POST", "/v2/sandboxes", KEY_A, Some(body)).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{metadata}: {}", refused.text());
        let message = refused.json()["message"].as_str().unwrap_or_default().to_owned();
        assert!(message.contains("metadata"), "{metadata}: {message}");
    }
    let listed = control(&h, "GET", "/v2/sandboxes", KEY_A, None).await.json();
    assert_eq!(listed, json!([]), "a refused create leaves no sandbox");
}

#[tokio::test]
async fn the_configured_domain_is_in_the_create_answer_and_in_get_info() {
    let mut config = crate::harness::test_config();
    config.e2b.domain = Some("sandboxes.example.test".to_owned());
    let h = Harness::with_config(config);
    let body = json!({ "templateID": "base", "timeout": 60 });
    let created = control(&h, "POST", "/v2/sandboxes", KEY_A, Some(body)).await.json();
    assert_eq!(created["domain"], "sandboxes.example.test", "{created}");
    let id = created["sandboxID"].as_str().unwrap();
    let info = control(&h, "GET", &format!("/sandboxes/{id}"), KEY_A, None).await.json();
    assert_eq!(info["domain"], "sandboxes.example.test", "get_info answers the domain the create did: {info}");
}

#[tokio::test]
async fn get_info_has_e2b_s_detail_fields() {
    let h = Harness::new();
    let sb = open(&h, KEY_A, json!({})).await;
    let info = control(&h, "GET", &format!("/sandboxes/{}", sb.id), KEY_A, None).await.json();
    assert_eq!((info["alias"].as_str(), info["domain"].clone()), (Some("base"), Value::Null));
    assert_eq!(info["lifecycle"], json!({"autoResume": false, "onTimeout": "kill"}));
    assert_eq!(info["allowInternetAccess"], false);
    assert_eq!(info["network"]["denyOut"], json!(["0.0.0.0/0"]));
    assert_eq!(info["volumeMounts"], json!([]));
    assert!(info["cpuCount"].as_u64().unwrap() >= 1 && info["memoryMB"].as_u64().unwrap() > 0, "{info}");
    assert!(info.get("pauseMode").is_none(), "only a paused sandbox has one");
    // The list carries ListedSandbox's fields, not the details.
    let listed = control(&h, "GET", "/v2/sandboxes", KEY_A, None).await.json();
    assert!(listed[0].get("envdAccessToken").is_none() && listed[0].get("lifecycle").is_none(), "{listed}");
    assert_eq!(listed[0]["alias"], "base");
}

#[tokio::test]
async fn execute_hands_the_cells_envs_to_the_runtime_and_refuses_bad_names() {
    let h = Harness::new();
    let sb = open(&h, KEY_A, json!({})).await;
    let cell = json!({ "code": "env:FOO", "language": "python", "env_vars": { "FOO": "bar" } });
    let reply = sandbox_call(&h, &sb, "POST", "/execute", "application/json", cell.to_string().into_bytes()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let result =
        reply.text().lines().map(|line| serde_json::from_str::<Value>(line).unwrap()).find(|l| l["type"] == "result");
    assert_eq!(result.map(|r| r["text"].clone()), Some(json!("bar")));
    for bad in [json!({ "A=B": "x" }), json!({ "": "x" }), json!({ "OK": "nul\u{0}" })] {
        let cell = json!({ "code": "1", "env_vars": bad });
        let reply = sandbox_call(&h, &sb, "POST", "/execute", "application/json", cell.to_string().into_bytes()).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{bad}: {}", reply.text());
        assert!(reply.text().contains("environment variable"), "{}", reply.text());
    }
}

#[tokio::test]
async fn a_cell_whose_client_leaves_is_interrupted() {
    let h = Harness::new();
    let sb = open(&h, KEY_A, json!({})).await;
    let cell = json!({ "code": "hang", "language": "python" }).to_string();
    let request = axum::http::Request::post("/execute")
        .header("e2b-sandbox-id", sb.id.as_str())
        .header("x-access-token", sb.token.as_str())
        .header("content-type", "application/json")
        .body(Body::from(cell))
        .unwrap();
    let response = h.send(request).await;
    assert_eq!(response.status(), StatusCode::OK);
    // The client goes away without reading: the cell (an hour's timeout) is interrupted at once.
    drop(response);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while h.runtime.interrupted_cells.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(std::time::Instant::now() < deadline, "the abandoned cell was not interrupted");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn languages_without_their_runtime_are_400_naming_what_to_install() {
    let h = Harness::new();
    let sb = open(&h, KEY_A, json!({})).await;
    for (language, expected) in [
        ("r", "install R on the server's host"),
        ("JAVA", "install a JDK"),
        ("ts", "npm install -g typescript"),
        ("cobol", "use python, javascript"),
    ] {
        let cell = json!({ "code": "1", "language": language }).to_string().into_bytes();
        let reply = sandbox_call(&h, &sb, "POST", "/execute", "application/json", cell).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{language}: {}", reply.text());
        assert!(reply.text().contains(expected), "{language}: {}", reply.text());
        let context = json!({ "language": language }).to_string().into_bytes();
        let reply = sandbox_call(&h, &sb, "POST", "/contexts", "application/json", context).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{language}: {}", reply.text());
    }
    let upper = json!({ "code": "1", "language": " Python " }).to_string().into_bytes();
    assert_eq!(sandbox_call(&h, &sb, "POST", "/execute", "application/json", upper).await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_context_keeps_its_cwd() {
    let h = Harness::new();
    let sb = open(&h, KEY_A, json!({})).await;
    let body = json!({ "language": "python", "cwd": "work" }).to_string().into_bytes();
    let created = sandbox_call(&h, &sb, "POST", "/contexts", "application/json", body).await.json();
    assert_eq!(created["cwd"], "/home/user/work", "relative to the home, as E2B paths are");
    let listed = sandbox_call(&h, &sb, "GET", "/contexts", "application/json", Vec::new()).await.json();
    let found = listed.as_array().unwrap().iter().find(|c| c["id"] == created["id"]).cloned();
    assert_eq!(found.map(|c| c["cwd"].clone()), Some(json!("/home/user/work")));
    let escape = json!({ "cwd": "/home/user/../../etc" }).to_string().into_bytes();
    let reply = sandbox_call(&h, &sb, "POST", "/contexts", "application/json", escape).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
}

#[tokio::test]
async fn network_rules_become_header_rules_and_bad_ones_get_e2b_errors() {
    let h = Harness::new();
    let secret = json!({"value": "rule-value-123456", "hosts": ["api.example.com"]});
    let json_type = [("content-type", "application/json")];
    let put = h.call_with("PUT", "/v1/secrets/TOKEN", Some(KEY_A), Body::from(secret.to_string()), &json_type).await;
    assert_eq!(put.status, StatusCode::CREATED, "{}", put.text());
    let create = |rules: Value, allow: Value| json!({"templateID": "base", "timeout": 60, "network": {"denyOut": ["0.0.0.0/0"], "allowOut": allow, "rules": rules}});
    let rule = |host: &str, value: &str| json!({host: [{"transform": {"headers": {"Authorization": value}}}]});
    let allowed = json!(["api.example.com"]);
    for (rules, allow, status, words) in [
        (rule("api.example.com", "Bearer ${e2b.secrets.NOPE}"), allowed.clone(), 400, "\"NOPE\""),
        (rule("api.example.com", "${e2b.identity.aws}"), allowed.clone(), 501, "e2b.identity"),
        (rule("203.0.113.0/24", "x"), allowed.clone(), 501, "203.0.113.0/24"),
        (json!({"api.example.com": [{"transform": {"body": "x"}}]}), allowed.clone(), 501, "transform.headers"),
        (rule("other.example.com", "x"), allowed.clone(), 400, "other.example.com"),
        (rule("api.example.com", "${e2b.secrets.TOKEN}"), json!(["api.example.com", "b.example.com"]), 201, ""),
    ] {
        let reply = control(&h, "POST", "/v2/sandboxes", KEY_A, Some(create(rules.clone(), allow))).await;
        assert_eq!(reply.status.as_u16(), status, "{rules}: {}", reply.text());
        if status != 201 {
            let body = reply.json();
            assert_eq!(body["code"], status, "{body}");
            assert!(body["message"].as_str().unwrap().contains(words), "{rules}: {body}");
            continue;
        }
        let id = reply.json()["sandboxID"].as_str().unwrap().to_owned();
        let info = control(&h, "GET", &format!("/sandboxes/{id}"), KEY_A, None).await;
        assert!(!info.text().contains("rule-value-123456"), "the value in get_info: {}", info.text());
        assert_eq!(info.json()["network"]["rules"], rule("api.example.com", "${e2b.secrets.TOKEN}"));
        // An update may keep or drop the rule; one on a host not named at creation is refused.
        let update = |rules: Value| json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["api.example.com", "b.example.com"], "rules": rules});
        let same = control(
            &h,
            "PUT",
            &format!("/sandboxes/{id}/network"),
            KEY_A,
            Some(update(rule("api.example.com", "${e2b.secrets.TOKEN}"))),
        )
        .await;
        assert_eq!(same.status, StatusCode::NO_CONTENT, "{}", same.text());
        let new_host =
            control(&h, "PUT", &format!("/sandboxes/{id}/network"), KEY_A, Some(update(rule("b.example.com", "x"))))
                .await;
        assert_eq!(new_host.status, StatusCode::BAD_REQUEST, "{}", new_host.text());
        assert!(new_host.text().contains("b.example.com"), "{}", new_host.text());
        let dropped = control(&h, "PUT", &format!("/sandboxes/{id}/network"), KEY_A, Some(update(json!({})))).await;
        assert_eq!(dropped.status, StatusCode::NO_CONTENT, "{}", dropped.text());
        let info = control(&h, "GET", &format!("/sandboxes/{id}"), KEY_A, None).await.json();
        assert!(info["network"].get("rules").is_none(), "{info}");
    }
}

#[tokio::test]
async fn e2b_secrets_are_the_tenant_s_secrets_with_e2b_s_shapes_and_errors() {
    let h = Harness::new();
    let made = control(
        &h,
        "POST",
        "/secrets",
        KEY_A,
        Some(json!({"name": "OpenAI-Key", "value": "sk-value-1", "metadata": {"team": "a"}})),
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.text());
    let made = made.json();
    let id = made["secretID"].as_str().unwrap().to_owned();
    assert!(id.starts_with("sec_") && id.len() == 20, "{made}");
    assert_eq!((made["name"].clone(), made["currentVersion"].clone()), (json!("openai-key"), json!(1)), "lowercased");
    assert_eq!(made["metadata"], json!({"team": "a"}));
    assert!(made.get("value").is_none() && !made.to_string().contains("sk-value-1"), "{made}");
    // The same row as the native API's: listed there without hosts, never with the value.
    let native = h.call_with("GET", "/v1/secrets", Some(KEY_A), Body::empty(), &[]).await.json();
    assert_eq!(native["secrets"][0]["id"], json!(id), "{native}");
    assert_eq!(native["secrets"][0]["hosts"], json!([]), "{native}");
    assert!(!native.to_string().contains("sk-value-1"));
    // Get by id or name; update by name: a new version, metadata kept unless given.
    for key in [id.as_str(), "openai-key", "OPENAI-KEY"] {
        let got = control(&h, "GET", &format!("/secrets/{key}"), KEY_A, None).await;
        assert_eq!((got.status, got.json()["secretID"].clone()), (StatusCode::OK, json!(id)), "{key}");
    }
    let updated = control(&h, "POST", "/secrets/openai-key", KEY_A, Some(json!({"value": "sk-value-2"}))).await.json();
    assert_eq!((updated["currentVersion"].clone(), updated["metadata"].clone()), (json!(2), json!({"team": "a"})));
    let updated = control(&h, "POST", &format!("/secrets/{id}"), KEY_A, Some(json!({"value": "v3", "metadata": {}})))
        .await
        .json();
    assert_eq!((updated["currentVersion"].clone(), updated["metadata"].clone()), (json!(3), json!({})));
    // Another tenant sees none of it.
    assert_eq!(control(&h, "GET", &format!("/secrets/{id}"), KEY_B, None).await.status, StatusCode::NOT_FOUND);
    assert_eq!(control(&h, "GET", "/secrets", KEY_B, None).await.json(), json!([]));
    // Bad input: E2B's {code, message}, 4xx naming what is wrong; nothing written.
    let long_value = "v".repeat(8193);
    for (method, uri, body, status, words) in [
        ("POST", "/secrets", json!({"name": "openai-key", "value": "x"}), 409, "already exists"),
        ("POST", "/secrets", json!({"value": "x"}), 400, "\"name\""),
        ("POST", "/secrets", json!({"name": "x"}), 400, "\"value\""),
        ("POST", "/secrets", json!({"name": "has space", "value": "x"}), 400, "is invalid"),
        ("POST", "/secrets", json!({"name": "sec_x", "value": "x"}), 400, "reserved"),
        ("POST", "/secrets", json!({"name": "a", "value": long_value}), 400, "8192 bytes"),
        ("POST", "/secrets", json!({"name": "a", "value": "x", "metadata": {"k": 1}}), 400, "metadata"),
        ("POST", "/secrets", json!({"name": "a", "value": "line\nbreak"}), 400, "control character"),
        ("POST", "/secrets/nope", json!({"value": "x"}), 404, "not found"),
        ("POST", "/secrets/openai-key", json!({"name": "b", "value": "x"}), 400, "cannot be changed"),
        ("GET", "/secrets/nope", Value::Null, 404, "not found"),
        ("DELETE", "/secrets/nope", Value::Null, 404, "not found"),
        ("GET", "/secrets?limit=0", Value::Null, 400, "at least 1"),
        ("GET", "/secrets?nextToken=zzz", Value::Null, 400, "Invalid next token"),
    ] {
        let reply = control(&h, method, uri, KEY_A, (!body.is_null()).then_some(body.clone())).await;
        let answer = reply.json();
        assert_eq!((reply.status.as_u16(), answer["code"].clone()), (status, json!(status)), "{uri} {body}: {answer}");
        assert!(answer["message"].as_str().unwrap().contains(words), "{uri} {body}: {answer}");
    }
    let listed = control(&h, "GET", "/secrets", KEY_A, None).await.json();
    assert_eq!(listed.as_array().unwrap().len(), 1, "refused creates wrote nothing: {listed}");
    // Paging: newest first, x-next-token until the last page.
    for n in 0..4 {
        let body = json!({"name": format!("paged-{n}"), "value": "x"});
        assert_eq!(control(&h, "POST", "/secrets", KEY_A, Some(body)).await.status, StatusCode::CREATED);
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    let (mut seen, mut token) = (Vec::new(), String::new());
    for _ in 0..10 {
        let uri = if token.is_empty() {
            "/secrets?limit=2".to_owned()
        } else {
            format!("/secrets?limit=2&nextToken={token}")
        };
        let reply = control(&h, "GET", &uri, KEY_A, None).await;
        let page = reply.json();
        assert!(page.as_array().unwrap().len() <= 2, "{page}");
        seen.extend(page.as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap().to_owned()));
        match reply.headers.get("x-next-token") {
            Some(next) => token = next.to_str().unwrap().to_owned(),
            None => break,
        }
    }
    let distinct: std::collections::BTreeSet<_> = seen.iter().collect();
    assert_eq!((seen.len(), distinct.len()), (5, 5), "every secret once: {seen:?}");
    assert_eq!(seen[0], "paged-3", "newest first: {seen:?}");
    // Delete by id: 204, then 404.
    assert_eq!(control(&h, "DELETE", &format!("/secrets/{id}"), KEY_A, None).await.status, StatusCode::NO_CONTENT);
    assert_eq!(control(&h, "GET", "/secrets/openai-key", KEY_A, None).await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_tenant_holds_a_bounded_number_of_secrets() {
    let h = Harness::new();
    for n in 0..256 {
        let reply = control(&h, "POST", "/secrets", KEY_A, Some(json!({"name": format!("s{n}"), "value": "x"}))).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{n}: {}", reply.text());
    }
    let refused = control(&h, "POST", "/secrets", KEY_A, Some(json!({"name": "one-more", "value": "x"}))).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{}", refused.text());
    assert!(refused.json()["message"].as_str().unwrap().contains("256 secrets"));
    let json_type = [("content-type", "application/json")];
    let native = json!({"value": "x", "hosts": ["a.example.com"]}).to_string();
    let refused = h.call_with("PUT", "/v1/secrets/MORE", Some(KEY_A), Body::from(native.clone()), &json_type).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "the native API counts the same rows");
    let replaced = h.call_with("PUT", "/v1/secrets/s0", Some(KEY_A), Body::from(native), &json_type).await;
    assert_eq!(replaced.status, StatusCode::OK, "replacing one is no new secret: {}", replaced.text());
    let other = control(&h, "POST", "/secrets", KEY_B, Some(json!({"name": "mine", "value": "x"}))).await;
    assert_eq!(other.status, StatusCode::CREATED, "per tenant");
}
