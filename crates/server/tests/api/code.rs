//! The code-interpreter routes over the fake runtime: response shapes, the default context, context CRUD, SSE
//! events, validation and tenant isolation.

use axum::body::Body;
use serde_json::{Value, json};

use crate::harness::{Harness, KEY_A, KEY_B};

fn code_uri(id: &str) -> String {
    format!("/v1/sandboxes/{id}/code")
}

#[tokio::test]
async fn a_cell_answers_the_documented_shape_in_the_default_context() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let reply = h.post(&code_uri(&id), KEY_A, json!({"language": "python", "code": "x + 1"})).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body["sandbox_id"], id.as_str());
    assert!(body["context_id"].as_str().unwrap().starts_with("ctx-"));
    assert_eq!(body["execution_count"], 1);
    assert_eq!(body["results"], json!([{"text/plain": "x + 1", "is_main_result": true}]));
    assert_eq!(body["error"], Value::Null);
    assert_eq!(body["context_restarted"], false);
    for key in ["stdout", "stderr", "output_truncated", "duration_ms"] {
        assert!(body.get(key).is_some(), "{key} missing: {body}");
    }
    let again = h.post(&code_uri(&id), KEY_A, json!({"language": "python", "code": "print:hi"})).await.json();
    assert_eq!(again["context_id"], body["context_id"], "the default context is reused");
    assert_eq!(again["execution_count"], 2);
    assert_eq!(again["stdout"], "hi");
    let js = h.post(&code_uri(&id), KEY_A, json!({"language": "javascript", "code": "1"})).await.json();
    assert_ne!(js["context_id"], body["context_id"], "each language has its own default context");
}

#[tokio::test]
async fn a_raised_error_is_a_200_with_the_error() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let body = h.post(&code_uri(&id), KEY_A, json!({"language": "python", "code": "raise"})).await.json();
    assert_eq!(body["error"]["name"], "ValueError");
    assert_eq!(body["error"]["value"], "raised");
    assert_eq!(body["error"]["traceback"][1], "ValueError: raised");
}

#[tokio::test]
async fn contexts_can_be_created_listed_restarted_and_removed() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let uri = format!("/v1/sandboxes/{id}/contexts");
    let created = h.post(&uri, KEY_A, json!({"language": "javascript"})).await;
    assert_eq!(created.status, 201, "{}", created.text());
    let context = created.json();
    assert_eq!(context["language"], "javascript");
    assert_eq!(context["default"], false);
    let context_id = context["id"].as_str().unwrap().to_owned();

    let run = json!({"context_id": context_id, "code": "1"});
    assert_eq!(h.post(&code_uri(&id), KEY_A, run.clone()).await.json()["execution_count"], 1);
    let list = h.get(&uri, KEY_A).await.json();
    assert_eq!(list["contexts"][0]["id"], context_id.as_str());
    assert_eq!(list["contexts"][0]["execution_count"], 1);

    let restarted = h.post(&format!("{uri}/{context_id}/restart"), KEY_A, json!({})).await;
    assert_eq!(restarted.status, 200, "{}", restarted.text());
    assert_eq!(restarted.json()["execution_count"], 0);

    let mismatch = json!({"context_id": context_id, "language": "python", "code": "1"});
    h.post(&code_uri(&id), KEY_A, mismatch).await.assert_error(422, "unprocessable");

    assert_eq!(h.delete(&format!("{uri}/{context_id}"), KEY_A).await.status, 204);
    h.delete(&format!("{uri}/{context_id}"), KEY_A).await.assert_error(404, "not_found");
    h.post(&code_uri(&id), KEY_A, run).await.assert_error(404, "not_found");
    assert_eq!(h.get(&uri, KEY_A).await.json()["contexts"], json!([]));
}

#[tokio::test]
async fn bad_requests_are_refused_with_what_to_fix() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({"limits": {"timeout_ms": 5000}})).await;
    let uri = code_uri(&id);
    h.post(&uri, KEY_A, json!({"code": "1"})).await.assert_error(422, "unprocessable");
    h.post(&uri, KEY_A, json!({"language": "cobol", "code": "1"})).await.assert_error(422, "unprocessable");
    h.post(&uri, KEY_A, json!({"language": "python"})).await.assert_error(422, "unprocessable");
    h.post(&uri, KEY_A, json!({"language": "python", "code": "1", "bogus": 1}))
        .await
        .assert_error(422, "unprocessable");
    let message = h.post(&uri, KEY_A, json!({"language": "python", "code": "1", "timeout_ms": 5001})).await;
    assert!(message.assert_error(422, "unprocessable").contains("5000"));
    h.post(&uri, KEY_A, json!({"language": "python", "code": "1", "timeout_ms": 0}))
        .await
        .assert_error(422, "unprocessable");
    h.post(&uri, KEY_A, json!({"context_id": "../etc", "code": "1"})).await.assert_error(404, "not_found");
    h.post(&uri, KEY_A, json!({"context_id": "ctx-00000000000000ff", "code": "1"}))
        .await
        .assert_error(404, "not_found");
    let contexts = format!("/v1/sandboxes/{id}/contexts");
    h.post(&contexts, KEY_A, json!({})).await.assert_error(422, "unprocessable");
    h.delete(&format!("{contexts}/nope"), KEY_A).await.assert_error(404, "not_found");
    h.post(&format!("{contexts}/ctx-00000000000000ff/restart"), KEY_A, json!({})).await.assert_error(404, "not_found");
    let raw = h.call("POST", &uri, Some(KEY_A), Body::from("{not json")).await;
    raw.assert_error(400, "bad_request");
}

#[tokio::test]
async fn another_tenant_and_a_deleted_sandbox_get_no_contexts() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let run = json!({"language": "python", "code": "1"});
    h.post(&code_uri(&id), KEY_B, run.clone()).await.assert_error(404, "not_found");
    h.get(&format!("/v1/sandboxes/{id}/contexts"), KEY_B).await.assert_error(404, "not_found");
    h.post(&format!("/v1/sandboxes/{id}/contexts"), KEY_B, json!({"language": "python"}))
        .await
        .assert_error(404, "not_found");
    assert_eq!(h.delete(&format!("/v1/sandboxes/{id}"), KEY_A).await.status, 204);
    h.post(&code_uri(&id), KEY_A, run).await.assert_error(409, "conflict");
}

#[tokio::test]
async fn the_stream_sends_output_results_errors_and_the_end() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let uri = code_uri(&id);
    let stream = |code: &str| {
        let body = Body::from(json!({"language": "python", "code": code}).to_string());
        h.call_with("POST", &uri, Some(KEY_A), body, &[("accept", "text/event-stream")])
    };
    let printed = stream("print:hello").await;
    assert_eq!(printed.status, 200);
    let text = printed.text();
    let stdout = text.find("event: stdout\ndata: {\"data\":\"hello\"}").unwrap_or_else(|| panic!("{text}"));
    let end = text.find("event: end\n").unwrap_or_else(|| panic!("{text}"));
    assert!(stdout < end, "{text}");

    let valued = stream("41 + 1").await.text();
    let result = valued.find("event: result\ndata: {\"text/plain\":\"41 + 1\"").unwrap_or_else(|| panic!("{valued}"));
    assert!(result < valued.find("event: end\n").unwrap(), "{valued}");

    let raised = stream("raise").await.text();
    assert!(raised.contains("event: error\ndata: {\"name\":\"ValueError\""), "{raised}");
    let end_data = raised.split("event: end\ndata: ").nth(1).unwrap().lines().next().unwrap();
    let end: Value = serde_json::from_str(end_data).unwrap();
    assert_eq!(end["error"]["name"], "ValueError");
    assert_eq!(end["execution_count"], 3);
}
