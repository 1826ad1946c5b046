//! `isolation: "auto"` through the API, over the fake runtime: the server picks the tier by `[isolation.auto]` from
//! the tenant's trust and the request's `workload`, and says so in `isolation: {tier, reason, accel?}` of the create
//! answer, the sandbox's info, a `/v1/run` result and an exec result; a named tier says `requested`, none `server
//! default`; no usable tier is 422 `tier_unavailable` saying why, with nothing created.

use sandkasten_server::{ServerConfig, Trust};
use sandkasten_types::{MicrovmAccel, Tier};
use serde_json::json;

use crate::harness::{Harness, KEY_A, KEY_B, test_config};

/// Tenant alpha untrusted (the default), bravo internal.
fn config() -> ServerConfig {
    let mut config = test_config();
    config.tenants[1].trust = Trust::Internal;
    config
}

#[tokio::test]
async fn auto_puts_untrusted_code_on_gvisor_and_says_why_in_the_answer_and_the_info() {
    let h = Harness::with_config(config());
    let created = h.post("/v1/sandboxes", KEY_A, json!({"isolation": "auto"})).await;
    assert_eq!(created.status, 201, "{:?}", created.text());
    let body = created.json();
    assert_eq!(body["isolation"]["tier"], "gvisor", "{body}");
    let reason = body["isolation"]["reason"].as_str().unwrap_or_default().to_owned();
    assert!(reason.starts_with("auto: rule 4 (untrusted tenant) chose gvisor"), "{reason}");
    assert!(body["isolation"].get("accel").is_none(), "{body}");
    let id = body["id"].as_str().unwrap_or_default();
    let info = h.get(&format!("/v1/sandboxes/{id}"), KEY_A).await.json();
    assert_eq!(info["isolation"], body["isolation"]);
    assert_eq!(h.runtime.created_tiers(), [Some(Tier::Gvisor)]);
    let exec = h.post(&format!("/v1/sandboxes/{id}/exec"), KEY_A, json!({"argv": ["echo", "hi"]})).await.json();
    assert_eq!(exec["isolation"], body["isolation"], "{exec}");
}

#[tokio::test]
async fn auto_puts_internal_code_on_process_and_a_run_result_says_so() {
    let h = Harness::with_config(config());
    let run = h.post("/v1/run", KEY_B, json!({"isolation": "auto", "argv": ["echo", "hi"]})).await;
    assert_eq!(run.status, 200, "{:?}", run.text());
    let body = run.json();
    assert_eq!(body["isolation"]["tier"], "process", "{body}");
    assert!(body["isolation"]["reason"].as_str().unwrap_or_default().contains("internal tenant"), "{body}");
}

#[tokio::test]
async fn a_kernel_of_its_own_is_a_microvm_with_its_accel_only_when_emulation_is_allowed() {
    let h = Harness::with_config(config());
    let asked = json!({"isolation": "auto", "workload": {"needs_kernel": true}, "argv": ["uname"]});
    let message = h.post("/v1/run", KEY_B, asked.clone()).await.assert_error(422, "tier_unavailable");
    assert!(message.contains("needs its own kernel") && message.contains("software emulation"), "{message}");
    assert!(h.runtime.created_tiers().is_empty(), "nothing may be created");
    *h.runtime.microvm_accel.lock().unwrap() = Some(MicrovmAccel::Kvm);
    let body = h.post("/v1/run", KEY_B, asked).await.json();
    assert_eq!(body["isolation"]["tier"], "microvm", "{body}");
    assert_eq!(body["isolation"]["accel"], "kvm", "{body}");

    let mut emulating = config();
    emulating.isolation.auto.allow_emulation = true;
    let h = Harness::with_config(emulating);
    let created =
        h.post("/v1/sandboxes", KEY_A, json!({"isolation": "auto", "workload": {"needs_kernel": true}})).await;
    let body = created.json();
    assert_eq!(
        (body["isolation"]["tier"].as_str(), body["isolation"]["accel"].as_str()),
        (Some("microvm"), Some("tcg"))
    );
}

#[tokio::test]
async fn untrusted_syscall_heavy_work_skips_an_emulated_microvm_for_gvisor_and_never_lands_on_process() {
    let h = Harness::with_config(config());
    let asked = json!({"isolation": "auto", "workload": {"io_profile": "syscall_heavy"}});
    let body = h.post("/v1/sandboxes", KEY_A, asked.clone()).await.json();
    assert_eq!(body["isolation"]["tier"], "gvisor", "{body}");
    assert!(body["isolation"]["reason"].as_str().unwrap_or_default().contains("microvm skipped"), "{body}");
    h.runtime.unavailable_tiers.lock().unwrap().insert(Tier::Gvisor, "no runsc here".into());
    let message = h.post("/v1/sandboxes", KEY_A, asked).await.assert_error(422, "tier_unavailable");
    assert!(message.contains("none is usable here") && message.contains("no runsc here"), "{message}");
}

#[tokio::test]
async fn a_named_tier_is_requested_and_none_is_the_server_default() {
    let h = Harness::with_config(config());
    let named = h.post("/v1/sandboxes", KEY_A, json!({"isolation": "process"})).await.json();
    assert_eq!(named["isolation"], json!({"tier": "process", "reason": "requested"}));
    let unnamed = h.post("/v1/run", KEY_A, json!({"argv": ["true"]})).await.json();
    assert_eq!(unnamed["isolation"], json!({"tier": "process", "reason": "server default"}));
    let message =
        h.post("/v1/sandboxes", KEY_A, json!({"workload": {"kernel": true}})).await.assert_error(422, "unprocessable");
    assert!(message.contains("kernel"), "{message}");
}

/// A microVM's boot in the answers: the create answer's `vm_boot_ms`, a `/v1/run` result's `phases.vm_boot` (between
/// `allocate` and `filesystem_ready`), and 0 in an exec result (the VM was there) and on the other tiers.
#[tokio::test]
async fn microvm_answers_carry_the_vm_boot_phase() {
    let h = Harness::with_config(config());
    let created = h.post("/v1/sandboxes", KEY_A, json!({"isolation": "microvm"})).await.json();
    assert_eq!(created["isolation"]["accel"], "tcg", "{created}");
    let boot_ms = created["vm_boot_ms"].as_f64().unwrap_or_default();
    assert!((5.0..1000.0).contains(&boot_ms), "the fake's VM boots in 5 ms: {created}");
    let id = created["id"].as_str().unwrap_or_default();
    let info = h.get(&format!("/v1/sandboxes/{id}"), KEY_A).await.json();
    assert!(info.get("vm_boot_ms").is_none(), "only the create answer has it: {info}");
    let exec = h.post(&format!("/v1/sandboxes/{id}/exec"), KEY_A, json!({"argv": ["true"]})).await.json();
    assert_eq!(exec["phases"]["vm_boot"], 0.0, "{exec}");

    let run = h.post("/v1/run", KEY_A, json!({"isolation": "microvm", "argv": ["true"]})).await.json();
    let phase = |name: &str| run["phases"][name].as_f64().unwrap_or(-1.0);
    assert!(phase("vm_boot") > 0.0, "{run}");
    assert!(phase("vm_boot") - phase("allocate") >= 4.9, "the boot's 5 ms lie between: {run}");
    assert!(phase("vm_boot") <= phase("filesystem_ready"), "{run}");

    let plain = h.post("/v1/run", KEY_A, json!({"isolation": "process", "argv": ["true"]})).await.json();
    assert_eq!(plain["phases"]["vm_boot"], 0.0, "{plain}");
    let process = h.post("/v1/sandboxes", KEY_A, json!({"isolation": "process"})).await.json();
    assert!(process.get("vm_boot_ms").is_none(), "{process}");
}
