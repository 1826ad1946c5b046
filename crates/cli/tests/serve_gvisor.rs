//! The gvisor tier through the server, where it differs from the per-tier suites: warm pools of pre-started gVisor
//! sandboxes (a member serves only requests of its tier), `POST /v1/run` on gVisor, the server's default tier
//! applying to creates that name none, and a resume whose restore fails (the sandbox is lost, nothing left). Every
//! check that the guest is gVisor looks at what the kernel says inside (gVisor's Sentry reports release 4.4.0; the
//! host's is asserted different).

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::time::{Duration, Instant};

use sandkasten_types::Tier;
use serde_json::json;
use serve::{KEY_1, Server, assert_sandbox_gone_on, metric};

/// The release the Sentry reports (`uname -r` inside a gVisor sandbox).
const GVISOR_RELEASE: &str = "4.4.0";

fn host_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned()
}

fn wait_metric(server: &Server, name: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let value = metric(server, name);
        if value == want {
            return;
        }
        assert!(Instant::now() < deadline, "{name} is {value}, want {want}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn uname_in(server: &Server, id: &str) -> String {
    let reply = server.exec(id, "uname -r");
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.json["stdout"].as_str().unwrap_or_default().trim().to_owned()
}

#[test]
fn a_gvisor_pool_member_serves_gvisor_creates_and_never_a_process_one() {
    require_runsc!();
    assert_ne!(host_release(), GVISOR_RELEASE, "the host must not look like gVisor for this test to mean anything");
    let pools = "[[pools]]\nname = \"gv\"\nisolation = \"gvisor\"\nmin = 1\nmax = 1\n";
    let server = Server::start_with(pools);
    wait_metric(&server, "sandkasten_pool_size{class=\"gv\"}", 1.0);

    // A process-tier create must not take the gVisor member.
    let process = server.create(json!({ "isolation": "process" }));
    assert_eq!(metric(&server, "sandkasten_pool_hits_total"), 0.0, "a process create was served by the gVisor pool");
    assert_eq!(uname_in(&server, &process), host_release());

    let hits_before = metric(&server, "sandkasten_pool_hits_total");
    let reply = server.call("POST", "/v1/sandboxes", KEY_1, Some(json!({ "isolation": "gvisor" })));
    assert_eq!(reply.status, 201, "{reply:?}");
    assert_eq!(reply.json["isolation"]["tier"], "gvisor", "{reply:?}");
    let id = reply.json["id"].as_str().expect("id").to_owned();
    assert_eq!(metric(&server, "sandkasten_pool_hits_total"), hits_before + 1.0, "the gVisor create missed its pool");
    assert_eq!(uname_in(&server, &id), GVISOR_RELEASE, "the pooled member is not a gVisor sandbox");

    for id in [&process, &id] {
        assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    }
    assert_sandbox_gone_on(Tier::Process, &process);
    assert_sandbox_gone_on(Tier::Gvisor, &id);
}

#[test]
fn v1_run_on_gvisor_runs_under_gvisor_and_says_so() {
    require_runsc!();
    let server = Server::start();
    let body = json!({
        "isolation": "gvisor",
        "language": "python",
        "code": "import os; print(os.uname().release, os.getuid())",
    });
    let reply = server.call("POST", "/v1/run", KEY_1, Some(body));
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.json["isolation"]["tier"], "gvisor", "{reply:?}");
    assert_eq!(reply.json["exit_code"], 0, "{reply:?}");
    assert_eq!(reply.json["stdout"].as_str().unwrap_or_default().trim(), format!("{GVISOR_RELEASE} 1000"));
    let id = reply.json["sandbox_id"].as_str().unwrap_or_default().to_owned();
    if !id.is_empty() {
        assert_sandbox_gone_on(Tier::Gvisor, &id);
    }
}

#[test]
fn the_servers_default_tier_applies_to_creates_that_name_none() {
    require_runsc!();
    let server = Server::start_with("[defaults]\nisolation = \"gvisor\"\n");
    let id = server.create(json!({}));
    let info = server.call("GET", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert_eq!(info.json["isolation"]["tier"], "gvisor", "{info:?}");
    assert_eq!(uname_in(&server, &id), GVISOR_RELEASE);
    // Naming a tier still wins over the default.
    let process = server.create(json!({ "isolation": "process" }));
    assert_eq!(uname_in(&server, &process), host_release());
    for id in [&id, &process] {
        assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    }
    assert_sandbox_gone_on(Tier::Gvisor, &id);
    assert_sandbox_gone_on(Tier::Process, &process);
}

#[test]
fn a_sandbox_whose_restore_fails_answers_why_and_is_lost_with_nothing_left() {
    require_runsc!();
    let server = Server::start();
    let id = server.create_on(Tier::Gvisor, json!({}));
    let base = format!("/v1/sandboxes/{id}");
    let paused = server.call("POST", &format!("{base}/pause"), KEY_1, None);
    assert_eq!(paused.status, 200, "{paused:?}");
    // The image is damaged on the host (a full disk, an operator's mistake): the restore cannot read it.
    let image = std::path::Path::new(common::GVISOR_CHECKPOINTS).join(&id).join("checkpoint.img");
    std::fs::write(&image, b"not a checkpoint").unwrap();

    let resumed = server.call("POST", &format!("{base}/resume"), KEY_1, None);
    assert!(resumed.status >= 500, "a failed restore is the host's failure: {resumed:?}");
    let message = resumed.json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("restoring sandbox") && message.contains("gone"), "it says what happened: {message}");
    eprintln!("a failed restore answers {}: {message}", resumed.status);
    // Never half-alive: the sandbox is lost, and nothing of it is left on the host.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = server.call("GET", &base, KEY_1, None).json["state"].clone();
        if state == "lost" {
            break;
        }
        assert!(Instant::now() < deadline, "the sandbox is {state} after its restore failed, not lost");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_sandbox_gone_on(Tier::Gvisor, &id);
    let exec = server.exec(&id, "true");
    assert_eq!(exec.status, 409, "a lost sandbox runs nothing: {exec:?}");
}

/// The OOM score adjustments of sandbox `id`'s host processes: (Sentry and gofer, the stubs that hold its programs'
/// memory). The stubs are the Sentry's descendants that are not runsc processes (their argv is empty).
fn oom_scores(id: &str) -> (Vec<i32>, Vec<i32>) {
    let score =
        |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).unwrap().trim().parse().unwrap();
    let runtime = common::wait_for_runsc_processes(id, Duration::from_secs(10));
    let sentry = runtime.iter().find(|(_, line)| line.starts_with("runsc-sandbox")).map(|(pid, _)| *pid);
    let sentry = sentry.unwrap_or_else(|| panic!("no Sentry of {id} on the host: {runtime:?}"));
    let cgroup = format!("/sys/fs/cgroup/memory/sandkasten/{id}/cgroup.procs");
    let cgroup = if std::path::Path::new(&cgroup).exists() {
        cgroup
    } else {
        format!("/sys/fs/cgroup/sandkasten/{id}/cgroup.procs")
    };
    let stubs: Vec<u32> = std::fs::read_to_string(&cgroup)
        .unwrap()
        .lines()
        .filter_map(|line| line.parse().ok())
        .filter(|pid| !runtime.iter().any(|(runsc, _)| runsc == pid))
        .collect();
    assert!(!stubs.is_empty(), "no stub processes of {id} in {cgroup} (systrap maps each program into one)");
    let runtime_scores = runtime.iter().filter(|(pid, _)| *pid != sentry).map(|(pid, _)| score(*pid));
    (std::iter::once(score(sentry)).chain(runtime_scores).collect(), stubs.into_iter().map(score).collect())
}

/// Drops from the page cache whatever of runsc's file no process maps or locks (`POSIX_FADV_DONTNEED`, as a cold
/// cache or the host's memory pressure would) and answers (resident pages, pages) of the file after it (`mincore`).
fn evict_runsc_from_page_cache() -> (usize, usize) {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(common::RUNSC).unwrap();
    let len = file.metadata().unwrap().len() as usize;
    // SAFETY: fadvise on a descriptor we own; mmap of it read-only at an address the kernel picks; mincore into a
    // vector of one byte per page of that mapping; munmap of the same mapping.
    unsafe {
        assert_eq!(libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED), 0);
        let addr = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0);
        assert_ne!(addr, libc::MAP_FAILED);
        let page = libc::sysconf(libc::_SC_PAGESIZE) as usize;
        let mut pages = vec![0u8; len.div_ceil(page)];
        assert_eq!(libc::mincore(addr, len, pages.as_mut_ptr()), 0);
        libc::munmap(addr, len);
        (pages.iter().filter(|state| **state & 1 == 1).count(), pages.len())
    }
}

/// A memory bomb in a live gVisor sandbox ends the program, never the sandbox: the host's OOM killer weighs each
/// program's stub process against the Sentry, and the Sentry is the heavier of the two often enough (about every
/// other bomb before the stubs were given the higher OOM score) that five bombs in a row would end it. Checked on a
/// fresh sandbox and on one resumed from a pause (a restore starts the Sentry and its stubs anew), with runsc's code
/// dropped from the page cache before each: a Sentry that read its own code on its sandbox's account had it evicted
/// by the bomb, faulted it back in to free the killed program's memory, and the OOM killer took the sandbox's other
/// stubs, the agent's among them (every bomb on a cold cache, before the server kept runsc's code resident).
#[test]
fn memory_bombs_end_the_program_never_the_gvisor_sandbox() {
    require_runsc!();
    let server = Server::start();
    evict_runsc_from_page_cache();
    let id = server.create_on(Tier::Gvisor, json!({"limits": {"memory_bytes": 96 << 20}}));
    let (resident, pages) = evict_runsc_from_page_cache();
    assert_eq!(resident, pages, "runsc's code is not kept resident once a gVisor sandbox started");
    let bomb = "a = []\nwhile True:\n    a.append(bytearray(8 << 20))\n";
    for round in ["fresh", "resumed"] {
        if round == "resumed" {
            for step in ["pause", "resume"] {
                let reply = server.call("POST", &format!("/v1/sandboxes/{id}/{step}"), KEY_1, None);
                assert_eq!(reply.status, 200, "{step}: {reply:?}");
            }
        }
        evict_runsc_from_page_cache();
        let (runtime, stubs) = oom_scores(&id);
        assert!(
            stubs.iter().all(|stub| runtime.iter().all(|own| stub > own)),
            "{round}: a stub is not a likelier OOM pick than the Sentry and gofer: stubs {stubs:?}, runtime {runtime:?}"
        );
        let sentry = common::wait_for_runsc_processes(&id, Duration::from_secs(10));
        for attempt in 1..=5 {
            let reply = server.call(
                "POST",
                &format!("/v1/sandboxes/{id}/exec"),
                KEY_1,
                Some(json!({"argv": ["/usr/bin/python3", "-c", bomb]})),
            );
            assert_eq!(reply.status, 200, "{round} bomb {attempt} ended the sandbox: {reply:?}");
            let limit = (reply.json["oom_killed"].as_bool(), reply.json["limit"].as_str());
            assert_eq!(limit, (Some(true), Some("memory")), "{round} bomb {attempt}: {}", reply.json);
            let after = common::wait_for_runsc_processes(&id, Duration::from_secs(1));
            assert_eq!(after, sentry, "{round} bomb {attempt}: the sandbox's runsc processes changed");
            assert_eq!(uname_in(&server, &id), GVISOR_RELEASE, "{round} bomb {attempt}: the sandbox no longer runs");
        }
    }
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    assert_sandbox_gone_on(Tier::Gvisor, &id);
}
