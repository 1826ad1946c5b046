//! A sandbox's usage samples against a real `sandkasten serve` (#12, E2B's `get_metrics()`): what the metrics say a
//! sandbox holds is what hostile-or-not code inside really made it hold — memory a process touched, a file written to
//! its home, a busy loop's CPU — read on the host from its cgroup and from its own filesystems; the sampler takes
//! samples on its own every `sample_interval_s`, none while the sandbox is paused, and again after it resumes.
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::time::{Duration, Instant};

use common::Tier;
use serde_json::{Value, json};
use serve::{KEY_1, Server, assert_sandbox_gone_on};

per_tier!(metrics_show_the_memory_disk_and_cpu_the_sandbox_uses, the_sampler_samples_on_its_own_but_not_while_paused,);

/// The sampler's interval in these tests.
const SAMPLER: &str = "[metrics]\nsample_interval_s = 1\n";

fn metrics(server: &Server, id: &str) -> Vec<Value> {
    let reply = server.call("GET", &format!("/v1/sandboxes/{id}/metrics"), KEY_1, None);
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.json["samples"].as_array().unwrap().clone()
}

/// Polls the metrics (up to 60 s) until the newest sample satisfies `good`; returns it.
fn newest_until(server: &Server, id: &str, what: &str, good: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let samples = metrics(server, id);
        if let Some(newest) = samples.last()
            && good(newest)
        {
            return newest.clone();
        }
        assert!(Instant::now() < deadline, "no sample showed {what}: {samples:?}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn at_least(sample: &Value, key: &str, bytes: u64) -> bool {
    sample[key].as_u64().unwrap_or(0) >= bytes
}

fn metrics_show_the_memory_disk_and_cpu_the_sandbox_uses(tier: Tier) {
    let server = Server::start_with_on(tier, SAMPLER);
    let limits = json!({"memory_bytes": 512u64 << 20, "disk_bytes": 256u64 << 20, "cpus": 1.0});
    let id = server.create_on(tier, json!({"limits": limits, "timeout_s": 300}));
    let idle = newest_until(&server, &id, "a first sample", |_| true);
    // A microVM's cgroup holds its VMM and the guest RAM the guest has touched (its kernel, what the boot read):
    // ~200 MiB idle here, below the limit. Elsewhere it is what the sandbox's own processes hold.
    let idle_bound: u64 = if tier == Tier::Microvm { 384 << 20 } else { 96 << 20 };
    let idle_bytes = idle["memory_used_bytes"].as_u64().unwrap();
    assert!(idle_bytes < idle_bound, "an idle sandbox holds {idle}");
    assert!(idle["disk_total_bytes"].as_u64().unwrap() >= 256 << 20, "the home alone is 256 MiB: {idle}");

    // 48 MiB written to the home: the disk fill shows it.
    assert_eq!(server.exec(&id, "head -c 50331648 /dev/zero > ~/blob").status, 200);
    newest_until(&server, &id, "48 MiB on disk", |s| at_least(s, "disk_used_bytes", 48 << 20));

    // A process holding 128 MiB of touched memory: the memory shows it (a tmpfs file counts too, so at least
    // the 128 MiB; the 48 MiB file is memory as well). In a microVM the guest's newly touched pages add to what
    // the idle VM held (most of its 512 MiB were never touched before).
    let hold = "exec /usr/bin/python3 -c 'import time; b = bytearray(128 << 20); time.sleep(120)'";
    let started =
        server.call("POST", &format!("/v1/sandboxes/{id}/exec"), KEY_1, Some(json!({"cmd": hold, "background": true})));
    assert_eq!(started.status, 202, "{started:?}");
    let held: u64 = if tier == Tier::Microvm { idle_bytes + (96 << 20) } else { 128 << 20 };
    newest_until(&server, &id, "128 MiB held", |s| at_least(s, "memory_used_bytes", held));

    // A busy loop at one CPU: a sample measured over its run shows a good share of the allowance.
    let busy = json!({"cmd": "timeout 30 bash -c 'while :; do :; done'", "background": true});
    assert_eq!(server.call("POST", &format!("/v1/sandboxes/{id}/exec"), KEY_1, Some(busy)).status, 202);
    newest_until(&server, &id, "a busy CPU", |s| s["cpu_used_pct"].as_f64().unwrap_or(0.0) >= 30.0);

    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    assert_sandbox_gone_on(tier, &id);
}

fn the_sampler_samples_on_its_own_but_not_while_paused(tier: Tier) {
    let server = Server::start_with_on(tier, SAMPLER);
    let id = server.create_on(tier, json!({"timeout_s": 300}));
    let base = format!("/v1/sandboxes/{id}");
    // No request for 3.5 s: the samples taken meanwhile are the sampler's (a request adds at most one).
    std::thread::sleep(Duration::from_millis(3500));
    let before_pause = metrics(&server, &id);
    assert!(before_pause.len() >= 3, "the sampler took {} samples in 3.5 s: {before_pause:?}", before_pause.len());

    assert_eq!(server.call("POST", &format!("{base}/pause"), KEY_1, None).status, 200);
    std::thread::sleep(Duration::from_millis(2500));
    let paused = metrics(&server, &id);
    let newest_paused = paused.last().unwrap()["timestamp_ms"].as_i64().unwrap();
    let newest_before = before_pause.last().unwrap()["timestamp_ms"].as_i64().unwrap();
    // At most one sample may have been taken between the last read and the pause.
    let taken_after = paused.iter().filter(|s| s["timestamp_ms"].as_i64().unwrap() > newest_before).count();
    assert!(taken_after <= 1, "samples of a paused sandbox: {paused:?}");
    assert_eq!(metrics(&server, &id).last().unwrap()["timestamp_ms"].as_i64().unwrap(), newest_paused);

    assert_eq!(server.call("POST", &format!("{base}/resume"), KEY_1, None).status, 200);
    newest_until(&server, &id, "a sample after the resume", |s| s["timestamp_ms"].as_i64().unwrap() > newest_paused);
    assert_eq!(server.call("DELETE", &base, KEY_1, None).status, 204);
    assert_sandbox_gone_on(tier, &id);
}
