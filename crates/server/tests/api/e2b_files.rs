//! The facade's `/files` extras over the fake runtime, on the wire: file metadata (`X-Metadata-*` upload headers)
//! bounded as envd bounds it, signed download/upload URLs (envd's v1 signature, 401 when missing, wrong or
//! expired) and the user a file request names (`user`, `root`, anything else refused) — every bad input a 4xx in
//! envd's `{"code", "message"}` shape, never a 500.

use axum::body::Body;
use axum::http::StatusCode;
use base64::Engine as _;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::harness::{Harness, KEY_A, Reply};

struct Opened {
    id: String,
    token: String,
}

async fn open(h: &Harness) -> Opened {
    let body = json!({ "templateID": "base", "timeout": 60 });
    let headers = [("x-api-key", KEY_A), ("content-type", "application/json")];
    let reply = h.call_with("POST", "/v2/sandboxes", None, Body::from(body.to_string()), &headers).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
    let json = reply.json();
    assert_eq!(
        json["envdVersion"], "0.6.3",
        "the version that turns file metadata and watch entry info on in the SDKs"
    );
    Opened { id: json["sandboxID"].as_str().unwrap().into(), token: json["envdAccessToken"].as_str().unwrap().into() }
}

/// An octet-stream upload of `data` to `path` with the access token and `extra` headers.
async fn upload(h: &Harness, sb: &Opened, path: &str, data: &str, extra: &[(&str, &str)]) -> Reply {
    let mut headers = vec![
        ("e2b-sandbox-id", sb.id.as_str()),
        ("x-access-token", sb.token.as_str()),
        ("content-type", "application/octet-stream"),
    ];
    headers.extend_from_slice(extra);
    h.call_with("POST", &format!("/files?path={path}"), None, Body::from(data.to_owned()), &headers).await
}

fn envd_error(reply: &Reply, status: u16) -> String {
    assert_eq!(reply.status.as_u16(), status, "{}", reply.text());
    let json: Value = reply.json();
    assert_eq!(json["code"], status, "envd's error shape: {json}");
    json["message"].as_str().unwrap().to_owned()
}

/// The SDK's `get_signature`, written out.
fn sign(path: &str, operation: &str, user: &str, token: &str, expiration: Option<i64>) -> String {
    let raw = match expiration {
        None => format!("{path}:{operation}:{user}:{token}"),
        Some(expiration) => format!("{path}:{operation}:{user}:{token}:{expiration}"),
    };
    format!("v1_{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(Sha256::digest(raw.as_bytes())))
}

fn url_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}

#[tokio::test]
async fn file_metadata_is_answered_back_and_bad_metadata_is_envd_s_400() {
    let h = Harness::new();
    let sb = open(&h).await;
    let written =
        upload(&h, &sb, "/home/user/a.txt", "x", &[("x-metadata-Origin", "suite"), ("X-Metadata-", "no key")]);
    let written = written.await;
    assert_eq!(written.status, StatusCode::OK, "{}", written.text());
    assert_eq!(written.json()[0]["metadata"], json!({"origin": "suite"}), "lowercased; an empty key is ignored");
    let plain = upload(&h, &sb, "/home/user/b.txt", "x", &[]).await.json();
    assert!(plain[0].get("metadata").is_none(), "no metadata, no field: {plain}");

    let long_key = format!("x-metadata-{}", "k".repeat(247));
    let cases: [(&str, String, &str); 4] = [
        (long_key.as_str(), "v".into(), "exceeds 246 bytes"),
        ("x-metadata-k", "v".repeat(4096), "exceeds 4096 bytes"),
        ("x-metadata-k", "caf\u{e9}".into(), "non-printable-ASCII byte 0xc3"),
        ("x-metadata-k", "tab\there".into(), "non-printable-ASCII byte 0x09"),
    ];
    for (name, value, why) in cases {
        let refused = upload(&h, &sb, "/home/user/bad.txt", "x", &[(name, value.as_str())]).await;
        let message = envd_error(&refused, 400);
        assert!(message.starts_with("invalid metadata: ") && message.contains(why), "{name}: {message}");
    }
    let headers = [("e2b-sandbox-id", sb.id.as_str()), ("x-access-token", sb.token.as_str())];
    let missing = h.call_with("GET", "/files?path=/home/user/bad.txt", None, Body::empty(), &headers).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "refused metadata writes nothing");
}

#[tokio::test]
async fn signed_urls_work_without_headers_and_are_401_when_missing_wrong_or_expired() {
    let h = Harness::new();
    let sb = open(&h).await;
    let other = open(&h).await;
    assert_eq!(upload(&h, &sb, "/home/user/s.txt", "signed", &[]).await.status, StatusCode::OK);
    // The URL names its sandbox (`&sandbox_id=`, or E2B's host name below); nothing else is sent.
    let get = |uri: String| {
        let h = &h;
        let uri = format!("{uri}&sandbox_id={}", sb.id);
        async move { h.call_with("GET", &uri, None, Body::empty(), &[]).await }
    };
    let path = "/home/user/s.txt";

    let plain = sign(path, "read", "", &sb.token, None);
    let ok = get(format!("/files?path={}&signature={}", url_encoded(path), url_encoded(&plain))).await;
    assert_eq!((ok.status, ok.text().as_str()), (StatusCode::OK, "signed"), "named by the URL alone");
    let uri = format!("/files?path={}&signature={}", url_encoded(path), url_encoded(&plain));
    let by_host = [("host", format!("49983-{}.e2b.app", sb.id))];
    let by_host = [(by_host[0].0, by_host[0].1.as_str())];
    let ok = h.call_with("GET", &uri, None, Body::empty(), &by_host).await;
    assert_eq!((ok.status, ok.text().as_str()), (StatusCode::OK, "signed"), "named by envd's host name");
    // A URL naming no sandbox is refused, never checked against every sandbox's token.
    let unnamed = h.call_with("GET", &uri, None, Body::empty(), &[]).await;
    assert!(envd_error(&unnamed, 401).contains("names no sandbox"));
    let unknown = format!("{uri}&sandbox_id=sb-00000000000000ff");
    let unknown = h.call_with("GET", &unknown, None, Body::empty(), &[]).await;
    assert!(envd_error(&unknown, 502).contains("was not found"), "an unknown sandbox is E2B's 'not found'");
    let later = now() + 60;
    let timed = sign(path, "read", "", &sb.token, Some(later));
    let ok = get(format!("/files?path={path}&signature={}&signature_expiration={later}", url_encoded(&timed))).await;
    assert_eq!(ok.text(), "signed");

    let earlier = now() - 10;
    let old = sign(path, "read", "", &sb.token, Some(earlier));
    let expired = get(format!("/files?path={path}&signature={}&signature_expiration={earlier}", url_encoded(&old)));
    assert_eq!(envd_error(&expired.await, 401), "signature is already expired");
    let missing = get(format!("/files?path={path}")).await;
    assert!(envd_error(&missing, 401).contains("missing signature"));
    let wrong = [
        sign(path, "write", "", &sb.token, None),
        sign("/home/user/other.txt", "read", "", &sb.token, None),
        sign(path, "read", "root", &sb.token, None),
        "v1_nonsense".to_owned(),
    ];
    for signature in wrong {
        let refused = get(format!("/files?path={path}&signature={}", url_encoded(&signature))).await;
        assert_eq!(envd_error(&refused, 401), "invalid signature", "{signature}");
    }
    // A URL signed for the default user stays the default user's: an Authorization header naming root is ignored.
    let as_root = [("authorization", "Basic cm9vdDo=")];
    let ok = h.call_with("GET", &format!("{uri}&sandbox_id={}", sb.id), None, Body::empty(), &as_root).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text());
    let read_as = *h.runtime.last_read_user.lock().unwrap();
    assert_eq!(read_as, Some(sandkasten_types::CommandUser::Sandbox), "a signed URL read as root");
    // The extended expiration is signed: moving it on breaks the signature.
    let moved = get(format!("/files?path={path}&signature={}&signature_expiration={}", url_encoded(&timed), later + 1));
    assert_eq!(envd_error(&moved.await, 401), "invalid signature");
    // Naming a sandbox whose token did not sign it is no way around it.
    let named = [("e2b-sandbox-id", other.id.as_str())];
    let uri = format!("/files?path={path}&signature={}", url_encoded(&plain));
    let refused = h.call_with("GET", &uri, None, Body::empty(), &named).await;
    assert_eq!(envd_error(&refused, 401), "invalid signature");
    let refused = h.call_with("GET", &format!("{uri}&sandbox_id={}", other.id), None, Body::empty(), &[]).await;
    assert_eq!(envd_error(&refused, 401), "invalid signature");
    let bad_expiration = get(format!("/files?path={path}&signature=x&signature_expiration=soon")).await;
    assert_eq!(bad_expiration.status, StatusCode::BAD_REQUEST, "{}", bad_expiration.text());

    // An upload URL signs "write".
    let up = sign("/home/user/up.txt", "write", "", &sb.token, None);
    let uri = format!("/files?path=/home/user/up.txt&signature={}&sandbox_id={}", url_encoded(&up), sb.id);
    let headers = [("content-type", "application/octet-stream")];
    let sent = h.call_with("POST", &uri, None, Body::from("by url"), &headers).await;
    assert_eq!(sent.status, StatusCode::OK, "{}", sent.text());
    let read_sig = sign("/home/user/up.txt", "read", "", &sb.token, None);
    let read = get(format!("/files?path=/home/user/up.txt&signature={}", url_encoded(&read_sig))).await;
    assert_eq!(read.text(), "by url");
    let uri = format!("/files?path=/home/user/up.txt&signature={}&sandbox_id={}", url_encoded(&read_sig), sb.id);
    let refused = h.call_with("POST", &uri, None, Body::from("x"), &headers).await;
    assert_eq!(envd_error(&refused, 401), "invalid signature", "a download's signature does not upload");
}

#[tokio::test]
async fn file_requests_name_user_or_root_and_no_one_else() {
    let h = Harness::new();
    let sb = open(&h).await;
    let headers = [("e2b-sandbox-id", sb.id.as_str()), ("x-access-token", sb.token.as_str())];
    let written = upload(&h, &sb, "/tmp/r.txt&username=root", "root's", &[]).await;
    assert_eq!(written.status, StatusCode::OK, "{}", written.text());
    let read = h.call_with("GET", "/files?path=/tmp/r.txt&username=root", None, Body::empty(), &headers).await;
    assert_eq!(read.text(), "root's");
    let refused = h.call_with("GET", "/files?path=/tmp/r.txt&username=nobody", None, Body::empty(), &headers).await;
    assert!(envd_error(&refused, 403).contains("user \"nobody\" is not available"));
    let stat = json!({"path": "/tmp/r.txt"}).to_string();
    let as_root = [("authorization", "Basic cm9vdDo="), ("content-type", "application/json")];
    let headers_root = [headers[0], headers[1], as_root[0], as_root[1]];
    let info = h.call_with("POST", "/filesystem.Filesystem/Stat", None, Body::from(stat), &headers_root).await;
    assert_eq!(info.status, StatusCode::OK, "{}", info.text());
    let watch = json!({"path": "/tmp"}).to_string();
    let refused = h.call_with("POST", "/filesystem.Filesystem/CreateWatcher", None, Body::from(watch), &headers_root);
    let refused = refused.await;
    assert_eq!(refused.status, StatusCode::NOT_IMPLEMENTED, "{}", refused.text());
}
