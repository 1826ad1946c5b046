//! Lifecycle of the CLI process itself: a sandbox must not outlive its owner, whether the owner is stopped politely
//! (SIGTERM, SIGINT) or killed outright (`kill -9`, after which `sandkasten gc` removes what the owner could not).

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]
// A failed assertion ends the test process, which reaps the CLI child with it.
#![allow(clippy::zombie_processes)]

#[macro_use]
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{assert_no_leaks, assert_no_token_processes, bin, exclusive_lock, leftovers, token_processes};

/// Starts `sandkasten run --timeout 60s <args>` and returns once the program printed `started`.
fn run_until_started(args: &[&str]) -> Child {
    let mut child = Command::new(bin())
        .args(["run", "--timeout", "60s"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sandkasten run");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("read started line");
    assert_eq!(line.trim(), "started", "the sandbox did not start");
    child
}

/// Starts `sandkasten run` with a shell that prints `started` and then sleeps with `token` in its argv; returns the
/// CLI child and the sandbox id (read from the sleeping process's cgroup on the host).
fn start_sleeper(token: &str) -> (Child, String) {
    let script = format!("echo started; sleep 600; : {token}");
    let child = run_until_started(&["--", "sh", "-c", &script]);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        // The CLI's own argv holds the token too: the sandboxed sleeper is the one running as a sandbox uid.
        let found = token_processes(token);
        let sandboxed =
            found.iter().find(|(pid, _)| common::process_uid(*pid).is_some_and(|uid| uid >= common::SANDBOX_UID_BASE));
        if let Some((pid, _)) = sandboxed {
            let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            let id = cgroup
                .split(|c: char| c == '/' || c.is_whitespace())
                .find(|part| part.starts_with("sb-"))
                .map(str::to_owned)
                .unwrap_or_default();
            assert!(!id.is_empty(), "sandbox process {pid} is not in a sandkasten cgroup: {cgroup}");
            return (child, id);
        }
        assert!(Instant::now() < deadline, "the sandboxed sleeper never appeared on the host");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &Child, signal: i32) {
    // SAFETY: kill(2) on our own, not yet reaped child.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    assert_eq!(rc, 0, "kill failed");
}

fn wait_with_deadline(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        assert!(Instant::now() < deadline, "sandkasten did not exit within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stop_politely_destroys_the_sandbox(sig: i32) {
    require_root!();
    let _lock = common::shared_lock();
    let token = common::unique_token("sk-lifecycle-");
    let (mut child, id) = start_sleeper(&token);
    signal(&child, sig);
    let status = wait_with_deadline(&mut child, Duration::from_secs(10));
    assert_eq!(status.code(), Some(128 + sig), "the CLI must exit with 128+signal after cleaning up");
    assert_no_token_processes(&token);
    assert_no_leaks(&id);
}

#[test]
fn sigterm_to_the_cli_destroys_the_sandbox() {
    stop_politely_destroys_the_sandbox(libc::SIGTERM);
}

#[test]
fn sigint_to_the_cli_destroys_the_sandbox() {
    stop_politely_destroys_the_sandbox(libc::SIGINT);
}

/// gVisor: the guest's processes are not host processes, so the sandbox is found by its code in its bundle; a stop
/// signal to the CLI destroys it (runsc, the Sentry, the gofer, bundle, state, cgroup, record) and exits 128 + signal.
fn stop_politely_destroys_the_gvisor_sandbox(sig: i32) {
    require_runsc!();
    let _lock = common::shared_lock();
    let token = common::unique_token("sk-lifecycle-gv-");
    let script = format!("echo started; sleep 600; : {token}");
    let mut child = run_until_started(&["--isolation", "gvisor", "--lang", "bash", "--code", &script]);
    let id = common::gvisor_sandbox_with_code(&token, Duration::from_secs(5)).expect("the sandbox's bundle");
    assert!(!common::wait_for_runsc_processes(&id, Duration::from_secs(5)).is_empty(), "no runsc process of {id}");
    signal(&child, sig);
    let status = wait_with_deadline(&mut child, Duration::from_secs(10));
    assert_eq!(status.code(), Some(128 + sig), "the CLI must exit with 128+signal after cleaning up");
    common::assert_no_gvisor_leaks(&id);
}

#[test]
fn sigterm_to_the_cli_destroys_the_gvisor_sandbox() {
    stop_politely_destroys_the_gvisor_sandbox(libc::SIGTERM);
}

#[test]
fn sigint_to_the_cli_destroys_the_gvisor_sandbox() {
    stop_politely_destroys_the_gvisor_sandbox(libc::SIGINT);
}

#[test]
fn kill_9_of_the_cli_kills_the_sandbox_and_gc_removes_the_rest() {
    require_root!();
    // Exclusive: no other run may garbage-collect this sandbox's leftovers before we look at them.
    let _lock = exclusive_lock();
    let token = common::unique_token("sk-kill9-");
    let (mut child, id) = start_sleeper(&token);
    signal(&child, libc::SIGKILL);
    let _ = wait_with_deadline(&mut child, Duration::from_secs(5));

    // The agent dies with its parent (PR_SET_PDEATHSIG), taking the whole pid namespace with it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !token_processes(&token).is_empty() {
        assert!(
            Instant::now() < deadline,
            "sandbox processes outlived kill -9 of their owner: {:?}",
            token_processes(&token)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The owner could not clean up: its record and cgroup are still there, and gc must find them.
    let left = leftovers(&id);
    assert!(left.iter().any(|l| l.contains("record")), "expected the crashed run's record to remain: {left:?}");
    assert!(left.iter().any(|l| l.contains("cgroup")), "expected the crashed run's cgroup to remain: {left:?}");

    let gc = Command::new(bin()).args(["gc", "--json"]).output().expect("run gc");
    assert!(gc.status.success(), "gc failed: {}", String::from_utf8_lossy(&gc.stderr));
    let report: serde_json::Value = serde_json::from_slice(&gc.stdout).expect("gc --json output");
    let removed = report["removed"].as_array().cloned().unwrap_or_default();
    assert!(removed.iter().any(|r| r.as_str() == Some(id.as_str())), "gc did not remove {id}: {report}");
    assert_no_leaks(&id);
}
