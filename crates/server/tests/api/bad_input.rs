//! Bad input on every endpoint is answered with 400/404/405/413/422 and `{"error": {"code", "message"}}`, never a
//! 500 and never a panic.

use axum::body::Body;
use serde_json::json;

use crate::harness::{Harness, KEY_A};

/// (method, path under the sandbox or absolute, body, expected status, expected code)
type Case = (&'static str, &'static str, &'static str, u16, &'static str);

const CREATE_CASES: &[Case] = &[
    ("POST", "/v1/sandboxes", "{", 400, "bad_request"),
    ("POST", "/v1/sandboxes", "42", 422, "unprocessable"),
    ("POST", "/v1/sandboxes", r#"{"template": 1}"#, 422, "unprocessable"),
    ("POST", "/v1/sandboxes", r#"{"bogus": 1}"#, 422, "unprocessable"),
    ("POST", "/v1/sandboxes", r#"{"template": "windows"}"#, 422, "unprocessable"),
    ("POST", "/v1/sandboxes", r#"{"limits": {"memory_bytes": 1}}"#, 422, "unprocessable"),
    ("POST", "/v1/sandboxes", r#"{"limits": {"memory_bytes": -1}}"#, 422, "unprocessable"),
    ("POST", "/v1/sandboxes", r#"{"limits": {"cpus": 0}}"#, 422, "unprocessable"),
    ("POST", "/v1/sandboxes", r#"{"limits": {"swap": 1}}"#, 422, "unprocessable"),
    ("POST", "/v1/sandboxes", r#"{"env": {"1BAD": "x"}}"#, 422, "unprocessable"),
    ("POST", "/v1/sandboxes", r#"{"env": {"A": "nul\u0000"}}"#, 422, "unprocessable"),
    ("POST", "/v1/sandboxes", r#"{"env": {"A": 1}}"#, 422, "unprocessable"),
    ("POST", "/v1/sandboxes", r#"{"metadata": {"bad key": "x"}}"#, 422, "unprocessable"),
    ("POST", "/v1/sandboxes", r#"{"timeout_s": 0}"#, 422, "unprocessable"),
    ("POST", "/v1/sandboxes", r#"{"timeout_s": 99999999999}"#, 422, "unprocessable"),
    ("POST", "/v1/sandboxes", r#"{"timeout_s": 1e400}"#, 400, "bad_request"),
    ("GET", "/v1/sandboxes?colour=red", "", 400, "bad_request"),
    ("GET", "/v1/sandboxes?state=sleeping", "", 400, "bad_request"),
    ("GET", "/v1/sandboxes?metadata.=x", "", 400, "bad_request"),
    ("GET", "/v1/sandboxes?limit=0", "", 400, "bad_request"),
    ("GET", "/v1/sandboxes?limit=1001", "", 400, "bad_request"),
    ("GET", "/v1/sandboxes?limit=-1", "", 400, "bad_request"),
    ("GET", "/v1/sandboxes?limit=ten", "", 400, "bad_request"),
    ("GET", "/v1/sandboxes?limit=5&cursor=garbage", "", 400, "bad_request"),
    ("GET", "/v1/sandboxes?limit=5&cursor=MTk3MC0wMS0wMVQwMDowMDowMC4wMDBaX19zYi0x", "", 400, "bad_request"),
    ("GET", "/v1/sandboxes?cursor=MTk3MC0wMS0wMVQwMDowMDowMC4wMDBaX19zYi0xX19hc2M%3D", "", 400, "bad_request"),
    ("GET", "/v1/sandboxes/sb-0123456789abcdef", "", 404, "not_found"),
    ("GET", "/v1/sandboxes/not-an-id", "", 404, "not_found"),
    ("GET", "/v1/sandboxes/%FF%FE", "", 400, "bad_request"),
    ("PATCH", "/v1/sandboxes", "", 405, "method_not_allowed"),
    ("GET", "/v1/nothing-here", "", 404, "not_found"),
];

/// Paths are relative to `/v1/sandboxes/{id}`.
const SANDBOX_CASES: &[Case] = &[
    ("POST", "/timeout", "{}", 422, "unprocessable"),
    ("POST", "/timeout", r#"{"timeout_s": "soon"}"#, 422, "unprocessable"),
    ("POST", "/timeout", r#"{"timeout_s": 0}"#, 422, "unprocessable"),
    ("POST", "/timeout", "not json", 400, "bad_request"),
    ("POST", "/exec", "", 422, "unprocessable"),
    ("POST", "/exec", r#"{"argv": []}"#, 422, "unprocessable"),
    ("POST", "/exec", r#"{"argv": [""]}"#, 422, "unprocessable"),
    ("POST", "/exec", r#"{"argv": ["ls"], "cmd": "ls"}"#, 422, "unprocessable"),
    ("POST", "/exec", r#"{"argv": ["a\u0000b"]}"#, 422, "unprocessable"),
    ("POST", "/exec", r#"{"argv": "ls"}"#, 422, "unprocessable"),
    ("POST", "/exec", r#"{"argv": ["ls"], "cwd": "tmp"}"#, 400, "bad_request"),
    ("POST", "/exec", r#"{"argv": ["ls"], "env": {"A-B": "1"}}"#, 422, "unprocessable"),
    ("POST", "/exec", r#"{"argv": ["ls"], "timeout_ms": 0}"#, 422, "unprocessable"),
    ("POST", "/exec", r#"{"argv": ["ls"], "background": "yes"}"#, 422, "unprocessable"),
    ("POST", "/exec", r#"{"argv": ["ls"], "shell": true}"#, 422, "unprocessable"),
    ("POST", "/exec", r#"{"argv": ["ls"]"#, 400, "bad_request"),
    ("POST", "/exec", r#"{"argv": ["ls"], "pty": {"cols": 0, "rows": 24}}"#, 422, "unprocessable"),
    ("POST", "/exec", r#"{"argv": ["ls"], "pty": {"cols": 80, "rows": 1001}}"#, 422, "unprocessable"),
    ("POST", "/exec", r#"{"argv": ["ls"], "pty": {"cols": 80}}"#, 422, "unprocessable"),
    ("POST", "/exec", r#"{"argv": ["ls"], "pty": {"cols": -1, "rows": 24}}"#, 422, "unprocessable"),
    ("POST", "/exec", r#"{"argv": ["ls"], "pty": {"cols": 80, "rows": 24, "depth": 1}}"#, 422, "unprocessable"),
    ("GET", "/commands/cmd-0000000000000000/stream?since=x", "", 400, "bad_request"),
    ("GET", "/commands/cmd-0000000000000000/stream", "", 404, "not_found"),
    ("POST", "/commands/cmd-0000000000000000/stdin", "not json", 400, "bad_request"),
    ("POST", "/commands/cmd-0000000000000000/stdin", r#"{"data": 1}"#, 422, "unprocessable"),
    ("POST", "/commands/cmd-0000000000000000/signal", r#"{"signal": true}"#, 422, "unprocessable"),
    ("POST", "/commands/cmd-0000000000000000/resize", r#"{"cols": 0, "rows": 24}"#, 422, "unprocessable"),
    ("POST", "/commands/cmd-0000000000000000/resize", r#"{"cols": 65536, "rows": 24}"#, 422, "unprocessable"),
    ("POST", "/commands/cmd-0000000000000000/resize", "{", 400, "bad_request"),
    ("POST", "/commands/cmd-0000000000000000/resize", r#"{"cols": 80, "rows": 24}"#, 404, "not_found"),
    ("DELETE", "/commands/not-a-command", "", 404, "not_found"),
    ("GET", "/files", "", 400, "bad_request"),
    ("GET", "/files?path=/a&extra=1", "", 400, "bad_request"),
    ("DELETE", "/files?path=/a&recursive=maybe", "", 400, "bad_request"),
    ("GET", "/files/list", "", 400, "bad_request"),
    ("GET", "/files/stat?path=", "", 400, "bad_request"),
    ("POST", "/files/mkdir", "{}", 422, "unprocessable"),
    ("POST", "/files/mkdir", r#"{"path": "/a", "parents": "yes"}"#, 422, "unprocessable"),
    ("POST", "/files/rename", r#"{"from": "/a"}"#, 422, "unprocessable"),
    ("POST", "/files/rename", "]", 400, "bad_request"),
    ("PUT", "/exec", "", 405, "method_not_allowed"),
];

#[tokio::test]
async fn every_endpoint_rejects_bad_input_with_a_json_error() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let base = format!("/v1/sandboxes/{id}");
    let sandbox_cases = SANDBOX_CASES.iter().map(|(m, p, b, s, c)| (*m, format!("{base}{p}"), *b, *s, *c));
    let cases = CREATE_CASES.iter().map(|(m, p, b, s, c)| (*m, p.to_string(), *b, *s, *c)).chain(sandbox_cases);
    for (method, uri, body, status, code) in cases {
        let reply = h.call(method, &uri, Some(KEY_A), Body::from(body)).await;
        let json: serde_json::Value = serde_json::from_slice(&reply.body).unwrap_or_default();
        let got = (reply.status.as_u16(), json["error"]["code"].as_str());
        assert_eq!(got, (status, Some(code)), "{method} {uri} {body}: {}", reply.text());
        let message = reply.assert_error(status, code);
        assert!(message.len() > 10, "{method} {uri}: message should say what to fix: {message}");
    }
    assert_eq!(h.runtime.ids().len(), 1, "no bad request created anything");
}

#[tokio::test]
async fn oversized_json_is_413() {
    let h = Harness::new();
    let big = format!(r#"{{"metadata": {{"k": "{}"}}}}"#, "x".repeat(100 << 10));
    h.call("POST", "/v1/sandboxes", Some(KEY_A), Body::from(big)).await.assert_error(413, "payload_too_large");
}

#[tokio::test]
async fn garbage_never_causes_a_server_error() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let bodies = ["", "null", "0", "\"x\"", "{}", "[]", "{\"argv\":null}", "\u{0}\u{1}\u{2}", "{\"path\":{}}", "🦀"];
    let paths = ["", "/timeout", "/exec", "/files?path=/x", "/files/list?path=/", "/files/mkdir", "/files/rename"];
    for method in ["GET", "POST", "PUT", "DELETE"] {
        for path in paths {
            for body in bodies {
                let uri = format!("/v1/sandboxes/{id}{path}");
                let reply = h.call(method, &uri, Some(KEY_A), Body::from(body)).await;
                assert!(reply.status.as_u16() < 500, "{method} {uri} {body:?} → {} {}", reply.status, reply.text());
                if !reply.status.is_success() {
                    assert!(reply.json()["error"]["code"].is_string(), "{method} {uri}: {}", reply.text());
                }
            }
        }
    }
}
