//! The OpenAPI description: the committed copy in `docs/api/openapi.json` equals what the code generates, and live
//! responses of the main routes have the status codes, content types and JSON keys the description declares.

use std::path::PathBuf;

use axum::body::Body;
use serde_json::{Value, json};

use crate::harness::{Harness, KEY_A, Reply};

const REGENERATE: &str = "SANDKASTEN_UPDATE_OPENAPI=1 cargo test -p sandkasten-server --test api openapi";

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/api/openapi.json")
}

#[test]
fn committed_spec_matches_the_code() {
    let generated = sandkasten_server::openapi_json();
    let path = committed_path();
    if std::env::var_os("SANDKASTEN_UPDATE_OPENAPI").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is out of date with the code; regenerate it with:\n    {REGENERATE}\nand commit the result",
        path.display()
    );
}

#[tokio::test]
async fn served_spec_is_the_generated_one() {
    let h = Harness::new();
    let reply = h.call("GET", "/openapi.json", None, Body::empty()).await;
    assert_eq!(reply.text(), sandkasten_server::openapi_json());
    let spec = reply.json();
    assert!(spec["openapi"].as_str().unwrap().starts_with("3."));
    assert_eq!(spec["components"]["securitySchemes"]["api_key"]["scheme"], "bearer");
}

fn resolve<'a>(spec: &'a Value, schema: &'a Value) -> &'a Value {
    if let Some(name) = schema["$ref"].as_str().and_then(|r| r.strip_prefix("#/components/schemas/")) {
        return resolve(spec, &spec["components"]["schemas"][name]);
    }
    if let Some(variant) = schema["oneOf"].as_array().and_then(|v| v.iter().find(|v| v["$ref"].is_string())) {
        return resolve(spec, variant);
    }
    schema
}

/// Checks that `value` has the keys `schema` declares: no undeclared key, every required key, recursively.
fn check_shape(spec: &Value, schema: &Value, value: &Value, at: &str) {
    let nullable = schema["oneOf"].as_array().is_some_and(|v| v.iter().any(|v| v["type"] == "null"));
    if value.is_null() && nullable {
        return;
    }
    let schema = resolve(spec, schema);
    if let Some(properties) = schema["properties"].as_object() {
        let object = value.as_object().unwrap_or_else(|| panic!("{at}: expected an object, got {value}"));
        for key in object.keys() {
            assert!(properties.contains_key(key), "{at}: key {key:?} is not in the spec ({schema})");
        }
        for required in schema["required"].as_array().into_iter().flatten() {
            let key = required.as_str().unwrap();
            assert!(object.contains_key(key), "{at}: required key {key:?} is missing from {value}");
        }
        for (key, child) in object {
            check_shape(spec, &properties[key], child, &format!("{at}.{key}"));
        }
    } else if let (Some(items), Some(array)) = (schema.get("items"), value.as_array()) {
        for (index, item) in array.iter().enumerate() {
            check_shape(spec, items, item, &format!("{at}[{index}]"));
        }
    }
}

#[track_caller]
fn conforms(spec: &Value, method: &str, template: &str, reply: &Reply) {
    let what = format!("{method} {template} → {}", reply.status);
    let operation = &spec["paths"][template][method.to_ascii_lowercase()];
    assert!(operation.is_object(), "{what}: operation not in the spec");
    let response = &operation["responses"][reply.status.as_str()];
    assert!(response.is_object(), "{what}: status not declared; body {}", reply.text());
    if reply.body.is_empty() {
        assert!(response.get("content").is_none(), "{what}: declared a body, got none");
        return;
    }
    let content_type = reply.headers["content-type"].to_str().unwrap();
    let essence = content_type.split(';').next().unwrap().trim();
    let media = &response["content"][essence];
    assert!(media.is_object(), "{what}: content type {essence} not declared in {response}");
    if essence == "application/json" {
        check_shape(spec, &media["schema"], &reply.json(), &what);
    }
}

#[tokio::test]
async fn live_responses_match_the_spec() {
    let h = Harness::new();
    let spec: Value = serde_json::from_str(&sandkasten_server::openapi_json()).unwrap();
    let check = |method: &'static str, template: &'static str| move |reply: Reply| (method, template, reply);
    let mut seen = Vec::new();

    let created = h.post("/v1/sandboxes", KEY_A, json!({"metadata": {"a": "b"}})).await;
    let id = created.json()["id"].as_str().unwrap().to_owned();
    let s = format!("/v1/sandboxes/{id}");
    seen.push(check("POST", "/v1/sandboxes")(created));
    seen.push(check("POST", "/v1/sandboxes")(h.post("/v1/sandboxes", KEY_A, json!({"timeout_s": 0})).await));
    seen.push(check("POST", "/v1/sandboxes")(h.call("POST", "/v1/sandboxes", None, Body::from("{}")).await));
    seen.push(check("POST", "/v1/sandboxes")(h.call("POST", "/v1/sandboxes", Some(KEY_A), Body::from("{")).await));
    seen.push(check("GET", "/v1/sandboxes")(h.get("/v1/sandboxes?metadata.a=b", KEY_A).await));
    seen.push(check("GET", "/v1/sandboxes")(h.get("/v1/sandboxes?nope=1", KEY_A).await));
    seen.push(check("GET", "/v1/sandboxes/{id}")(h.get(&s, KEY_A).await));
    seen.push(check("GET", "/v1/sandboxes/{id}")(h.get("/v1/sandboxes/sb-0000000000000000", KEY_A).await));
    let timeout = format!("{s}/timeout");
    seen.push(check("POST", "/v1/sandboxes/{id}/timeout")(h.post(&timeout, KEY_A, json!({"timeout_s": 60})).await));
    seen.push(check("POST", "/v1/sandboxes/{id}/timeout")(h.post(&timeout, KEY_A, json!({})).await));
    let exec = format!("{s}/exec");
    seen.push(check("POST", "/v1/sandboxes/{id}/exec")(h.post(&exec, KEY_A, json!({"argv": ["echo", "x"]})).await));
    seen.push(check("POST", "/v1/sandboxes/{id}/exec")(h.post(&exec, KEY_A, json!({"argv": []})).await));
    let sse = h
        .call_with("POST", &exec, Some(KEY_A), Body::from(r#"{"argv": ["echo"]}"#), &[("accept", "text/event-stream")])
        .await;
    seen.push(check("POST", "/v1/sandboxes/{id}/exec")(sse));
    let background = h.post(&exec, KEY_A, json!({"argv": ["cat"], "background": true})).await;
    let command = format!("{s}/commands/{}", background.json()["command_id"].as_str().unwrap());
    seen.push(check("POST", "/v1/sandboxes/{id}/exec")(background));
    seen.push(check("GET", "/v1/sandboxes/{id}/commands")(h.get(&format!("{s}/commands"), KEY_A).await));
    let stdin = format!("{command}/stdin");
    let (eof, more) = (json!({"data": "x", "eof": true}), json!({"data": "x"}));
    seen.push(check("POST", "/v1/sandboxes/{id}/commands/{command_id}/stdin")(h.post(&stdin, KEY_A, eof).await));
    seen.push(check("POST", "/v1/sandboxes/{id}/commands/{command_id}/stdin")(h.post(&stdin, KEY_A, more).await));
    let stream = format!("{command}/stream");
    seen.push(check("GET", "/v1/sandboxes/{id}/commands/{command_id}/stream")(h.get(&stream, KEY_A).await));
    seen.push(check("GET", "/v1/sandboxes/{id}/commands/{command_id}/stream")(
        h.get(&format!("{stream}?since=x"), KEY_A).await,
    ));
    let sleeper = h.post(&exec, KEY_A, json!({"argv": ["sleep-ms", "60000"], "background": true})).await;
    let sleeper = format!("{s}/commands/{}", sleeper.json()["command_id"].as_str().unwrap());
    let (term, bogus) = (json!({"signal": "SIGTERM"}), json!({"signal": "SIGBOGUS"}));
    let signal = format!("{sleeper}/signal");
    seen.push(check("POST", "/v1/sandboxes/{id}/commands/{command_id}/signal")(h.post(&signal, KEY_A, bogus).await));
    seen.push(check("POST", "/v1/sandboxes/{id}/commands/{command_id}/signal")(h.post(&signal, KEY_A, term).await));
    let terminal = h
        .post(&exec, KEY_A, json!({"argv": ["sleep-ms", "60000"], "background": true, "pty": {"cols": 80, "rows": 24}}))
        .await;
    let resize = format!("{s}/commands/{}/resize", terminal.json()["command_id"].as_str().unwrap());
    let resized = h.post(&resize, KEY_A, json!({"cols": 120, "rows": 40})).await;
    seen.push(check("POST", "/v1/sandboxes/{id}/commands/{command_id}/resize")(resized));
    let zero = h.post(&resize, KEY_A, json!({"cols": 0, "rows": 40})).await;
    seen.push(check("POST", "/v1/sandboxes/{id}/commands/{command_id}/resize")(zero));
    let no_terminal = h.post(&format!("{sleeper}/resize"), KEY_A, json!({"cols": 80, "rows": 24})).await;
    seen.push(check("POST", "/v1/sandboxes/{id}/commands/{command_id}/resize")(no_terminal));
    seen.push(check("DELETE", "/v1/sandboxes/{id}/commands/{command_id}")(h.delete(&command, KEY_A).await));
    seen.push(check("DELETE", "/v1/sandboxes/{id}/commands/{command_id}")(
        h.delete(&format!("{s}/commands/cmd-0000000000000000"), KEY_A).await,
    ));
    seen.push(check("POST", "/v1/run")(h.post("/v1/run", KEY_A, json!({"argv": ["echo", "x"]})).await));
    seen.push(check("POST", "/v1/run")(h.post("/v1/run", KEY_A, json!({"code": "x"})).await));
    let hostile = json!({"language": "python", "code": "import os\nos.system('rm -rf /')\n"});
    seen.push(check("POST", "/v1/scan")(h.post("/v1/scan", KEY_A, hostile).await));
    seen.push(check("POST", "/v1/scan")(h.post("/v1/scan", KEY_A, json!({"language": "cobol", "code": ""})).await));
    seen.push(check("GET", "/v1/pools")(h.get("/v1/pools", KEY_A).await));
    seen.push(check("GET", "/v1/config")(h.get("/v1/config", KEY_A).await));
    let admin = crate::config::admin_harness();
    seen.push(check("GET", "/v1/config")(admin.get("/v1/config", crate::config::KEY_OPS).await));
    let sizes = Body::from(r#"{"min": 1, "max": 2}"#);
    seen.push(check("PUT", "/v1/pools/{name}")(h.call("PUT", "/v1/pools/p", Some(KEY_A), sizes).await));
    seen.push(check("GET", "/v1/templates")(h.get("/v1/templates", KEY_A).await));
    seen.push(check("DELETE", "/v1/templates/{name}")(h.delete("/v1/templates/nonesuch", KEY_A).await));
    let code = format!("{s}/code");
    let contexts = format!("{s}/contexts");
    seen.push(check("POST", "/v1/sandboxes/{id}/code")(
        h.post(&code, KEY_A, json!({"language": "python", "code": "1"})).await,
    ));
    seen.push(check("POST", "/v1/sandboxes/{id}/code")(h.post(&code, KEY_A, json!({"code": "1"})).await));
    let context = h.post(&contexts, KEY_A, json!({"language": "python"})).await;
    let context_id = context.json()["id"].as_str().unwrap().to_owned();
    seen.push(check("POST", "/v1/sandboxes/{id}/contexts")(context));
    seen.push(check("GET", "/v1/sandboxes/{id}/contexts")(h.get(&contexts, KEY_A).await));
    seen.push(check("POST", "/v1/sandboxes/{id}/contexts/{context_id}/restart")(
        h.post(&format!("{contexts}/{context_id}/restart"), KEY_A, json!({})).await,
    ));
    seen.push(check("DELETE", "/v1/sandboxes/{id}/contexts/{context_id}")(
        h.delete(&format!("{contexts}/{context_id}"), KEY_A).await,
    ));
    let file = format!("{s}/files?path=/workspace/f");
    seen.push(check("PUT", "/v1/sandboxes/{id}/files")(h.put(&file, KEY_A, b"data").await));
    seen.push(check("PUT", "/v1/sandboxes/{id}/files")(h.put(&file, KEY_A, &vec![0; 1 << 20]).await));
    seen.push(check("GET", "/v1/sandboxes/{id}/files")(h.get(&file, KEY_A).await));
    seen.push(check("GET", "/v1/sandboxes/{id}/files")(h.get(&format!("{s}/files?path=/nope"), KEY_A).await));
    seen.push(check("GET", "/v1/sandboxes/{id}/files/list")(
        h.get(&format!("{s}/files/list?path=/workspace"), KEY_A).await,
    ));
    seen.push(check("GET", "/v1/sandboxes/{id}/files/stat")(
        h.get(&format!("{s}/files/stat?path=/workspace/f"), KEY_A).await,
    ));
    seen.push(check("GET", "/v1/sandboxes/{id}/files/stat")(h.get(&format!("{s}/files/stat?path=x"), KEY_A).await));
    let ports = "/v1/sandboxes/{id}/ports/{port}/{path}";
    seen.push(check("GET", ports)(h.get(&format!("{s}/ports/0/index.html"), KEY_A).await));
    // The fake runtime connects to no port: its refusal is the documented 409.
    seen.push(check("GET", ports)(h.get(&format!("{s}/ports/8000/index.html"), KEY_A).await));
    let mkdir = json!({"path": "/workspace/d"});
    seen.push(check("POST", "/v1/sandboxes/{id}/files/mkdir")(
        h.post(&format!("{s}/files/mkdir"), KEY_A, mkdir.clone()).await,
    ));
    seen.push(check("POST", "/v1/sandboxes/{id}/files/mkdir")(h.post(&format!("{s}/files/mkdir"), KEY_A, mkdir).await));
    let rename = json!({"from": "/workspace/f", "to": "/workspace/g"});
    seen.push(check("POST", "/v1/sandboxes/{id}/files/rename")(
        h.post(&format!("{s}/files/rename"), KEY_A, rename).await,
    ));
    let archive = format!("{s}/files/archive?path=/workspace");
    seen.push(check("GET", "/v1/sandboxes/{id}/files/archive")(h.get(&archive, KEY_A).await));
    let tar = h.get(&archive, KEY_A).await.body;
    seen.push(check("PUT", "/v1/sandboxes/{id}/files/archive")(
        h.put(&format!("{s}/files/archive?path=/tmp/unpacked"), KEY_A, &tar).await,
    ));
    seen.push(check("PUT", "/v1/sandboxes/{id}/files/archive")(h.put(&archive, KEY_A, b"not a tar").await));
    seen.push(check("DELETE", "/v1/sandboxes/{id}/files")(
        h.delete(&format!("{s}/files?path=/workspace/g"), KEY_A).await,
    ));
    let json_body = |value: Value| Body::from(serde_json::to_vec(&value).unwrap());
    let network = format!("{s}/network");
    let allow = json!({"mode": "allowlist", "allow": ["a.example"]});
    seen.push(check("PUT", "/v1/sandboxes/{id}/network")(h.call("PUT", &network, Some(KEY_A), json_body(allow)).await));
    let bad = json!({"mode": "allowlist", "allow": ["bad host"]});
    seen.push(check("PUT", "/v1/sandboxes/{id}/network")(h.call("PUT", &network, Some(KEY_A), json_body(bad)).await));
    seen.push(check("GET", "/v1/sandboxes/{id}/egress")(h.get(&format!("{s}/egress"), KEY_A).await));
    seen.push(check("GET", "/v1/sandboxes/{id}/egress")(h.get(&format!("{s}/egress?limit=0"), KEY_A).await));
    let secret = json!({"value": "v-0123456789", "hosts": ["a.example"]});
    let put_secret = |body: Value| h.call("PUT", "/v1/secrets/TOKEN", Some(KEY_A), json_body(body));
    seen.push(check("PUT", "/v1/secrets/{name}")(put_secret(secret.clone()).await));
    seen.push(check("PUT", "/v1/secrets/{name}")(put_secret(secret).await));
    seen.push(check("PUT", "/v1/secrets/{name}")(put_secret(json!({"value": "v", "hosts": []})).await));
    seen.push(check("GET", "/v1/secrets")(h.get("/v1/secrets", KEY_A).await));
    seen.push(check("DELETE", "/v1/secrets/{name}")(h.delete("/v1/secrets/TOKEN", KEY_A).await));
    seen.push(check("DELETE", "/v1/secrets/{name}")(h.delete("/v1/secrets/TOKEN", KEY_A).await));
    seen.push(check("GET", "/v1/sandboxes/{id}/metrics")(h.get(&format!("{s}/metrics"), KEY_A).await));
    let backwards = format!("{s}/metrics?from_ms=2&to_ms=1");
    seen.push(check("GET", "/v1/sandboxes/{id}/metrics")(h.get(&backwards, KEY_A).await));
    seen.push(check("POST", "/v1/sandboxes/{id}/pause")(h.post(&format!("{s}/pause"), KEY_A, json!({})).await));
    seen.push(check("POST", "/v1/sandboxes/{id}/pause")(h.post(&format!("{s}/pause"), KEY_A, json!({})).await));
    seen.push(check("POST", "/v1/sandboxes/{id}/exec")(h.post(&exec, KEY_A, json!({"argv": ["echo"]})).await));
    seen.push(check("POST", "/v1/sandboxes/{id}/resume")(h.post(&format!("{s}/resume"), KEY_A, json!({})).await));
    seen.push(check("POST", "/v1/sandboxes/{id}/resume")(h.post(&format!("{s}/resume"), KEY_A, json!({})).await));
    let taken = h.post(&format!("{s}/snapshots"), KEY_A, json!({"name": "n"})).await;
    let snapshot = taken.json()["snapshot_id"].as_str().unwrap().to_owned();
    seen.push(check("POST", "/v1/sandboxes/{id}/snapshots")(taken));
    let memory = json!({"memory": true});
    seen.push(check("POST", "/v1/sandboxes/{id}/snapshots")(h.post(&format!("{s}/snapshots"), KEY_A, memory).await));
    seen.push(check("GET", "/v1/snapshots")(h.get("/v1/snapshots", KEY_A).await));
    seen.push(check("GET", "/v1/snapshots/{id}")(h.get(&format!("/v1/snapshots/{snapshot}"), KEY_A).await));
    seen.push(check("GET", "/v1/snapshots/{id}")(h.get("/v1/snapshots/sn-0000000000000000", KEY_A).await));
    let restored = h.post("/v1/sandboxes", KEY_A, json!({"snapshot": snapshot})).await;
    let restored_id = restored.json()["id"].as_str().unwrap().to_owned();
    seen.push(check("POST", "/v1/sandboxes")(restored));
    h.delete(&format!("/v1/sandboxes/{restored_id}"), KEY_A).await;
    let forked = h.post(&format!("{s}/fork"), KEY_A, json!({"count": 1})).await;
    let fork_id = forked.json()["sandboxes"][0]["id"].as_str().unwrap().to_owned();
    seen.push(check("POST", "/v1/sandboxes/{id}/fork")(forked));
    h.delete(&format!("/v1/sandboxes/{fork_id}"), KEY_A).await;
    seen.push(check("POST", "/v1/sandboxes/{id}/fork")(h.post(&format!("{s}/fork"), KEY_A, json!({"count": 0})).await));
    seen.push(check("DELETE", "/v1/snapshots/{id}")(h.delete(&format!("/v1/snapshots/{snapshot}"), KEY_A).await));
    seen.push(check("DELETE", "/v1/snapshots/{id}")(h.delete(&format!("/v1/snapshots/{snapshot}"), KEY_A).await));
    seen.push(check("DELETE", "/v1/sandboxes/{id}")(h.delete(&s, KEY_A).await));
    let ended = json!({"mode": "none"});
    seen.push(check("PUT", "/v1/sandboxes/{id}/network")(h.call("PUT", &network, Some(KEY_A), json_body(ended)).await));
    seen.push(check("POST", "/v1/sandboxes/{id}/exec")(h.post(&exec, KEY_A, json!({"argv": ["echo"]})).await));
    seen.push(check("GET", "/healthz")(h.call("GET", "/healthz", None, Body::empty()).await));
    seen.push(check("GET", "/metrics")(h.call("GET", "/metrics", None, Body::empty()).await));
    seen.push(check("GET", "/openapi.json")(h.call("GET", "/openapi.json", None, Body::empty()).await));

    let mut statuses = std::collections::BTreeSet::new();
    for (method, template, reply) in &seen {
        conforms(&spec, method, template, reply);
        statuses.insert(reply.status.as_u16());
    }
    assert_eq!(statuses.into_iter().collect::<Vec<_>>(), [200, 201, 202, 204, 400, 401, 403, 404, 409, 413, 422]);
    // Every documented path was exercised.
    let documented: std::collections::BTreeSet<&str> =
        spec["paths"].as_object().unwrap().keys().map(String::as_str).collect();
    let exercised: std::collections::BTreeSet<&str> = seen.iter().map(|(_, template, _)| *template).collect();
    assert_eq!(documented, exercised);
}
