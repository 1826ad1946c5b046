//! Bad input around isolation tiers and a host whose gVisor cannot run, over the server and the CLI: a misspelt
//! `isolation` is refused naming the allowed values (422 / a clap usage error, exit 2); `microvm` and `auto` say they
//! are not available yet (422 `tier_unavailable` / exit 2); `gvisor` on a host without runsc says how to install it
//! (422 `tier_unavailable` / exit 2; a server whose default tier is gvisor does not start); an unknown gVisor platform
//! is refused when the server starts; and a runsc that fails to start fails the create with what runsc said, leaving
//! nothing on the host; a runsc removed while the server runs is refused the same way (and works again once back).
//!
//! "Nothing created" is checked on the host. CLI refusals hold the suite lock exclusively and compare the sandbox ids
//! with host state before and after (as `bad_input.rs` does, bundles and runsc state included). Server tests (and the
//! slow runsc failures) watch the record directory for the whole test instead: every sandbox writes its record before
//! anything else and removes it last, and the record names its owner (the server's spawner, or the CLI), so every
//! sandbox the test caused is seen, however briefly it existed.

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};
use serve::{KEY_1, Reply, Server, spawner_of};

/// What the fake runsc writes to its stderr before it exits 1.
const FAKE_RUNSC_SAYS: &str = "FAKE-RUNSC-7f3a: cannot start the sandbox: the platform exploded";

/// Watches the record directory and remembers every record that appears, with the owner pid it names (records are
/// written whole, by rename; one that vanishes before it could be read is not counted).
struct RecordWatch {
    seen: Arc<Mutex<BTreeMap<String, u64>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl RecordWatch {
    fn start() -> RecordWatch {
        let seen = Arc::new(Mutex::new(BTreeMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let before = dir_names(RECORD_DIR);
        let thread = {
            let (seen, stop) = (Arc::clone(&seen), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for name in dir_names(RECORD_DIR).difference(&before) {
                        let Some(id) = name.strip_suffix(".json") else { continue };
                        let mut seen = seen.lock().unwrap();
                        if !seen.contains_key(id)
                            && let Some(owner) = record_owner(id)
                        {
                            seen.insert(id.to_owned(), owner);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        };
        RecordWatch { seen, stop, thread: Some(thread) }
    }

    /// Stops watching; returns the ids of the records that named `owner`.
    fn owned_by(mut self, owner: u32) -> BTreeSet<String> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
        let seen = self.seen.lock().unwrap();
        seen.iter().filter(|(_, o)| **o == u64::from(owner)).map(|(id, _)| id.clone()).collect()
    }
}

impl Drop for RecordWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Waits (up to 10 s) until none of `ids` has anything left on the host (`gvisor_leftovers`).
fn assert_nothing_left_of(ids: &BTreeSet<String>, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<String> = ids.iter().flat_map(|id| gvisor_leftovers(id)).collect();
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "{what} left host state:\n  {}", left.join("\n  "));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every sandbox id with any host state: a record, a cgroup, a gVisor bundle or a runsc state entry.
fn host_sandbox_ids() -> BTreeSet<String> {
    let mut ids = global_state();
    ids.extend(dir_names(GVISOR_BUNDLES));
    for name in dir_names(RUNSC_ROOT) {
        let name = name.strip_prefix("runsc-").unwrap_or(&name).to_owned();
        if let Some(stem) = name.split(['_', '.', ':']).next().filter(|s| s.starts_with("sb-")) {
            ids.insert(stem.to_owned());
        }
    }
    ids
}

/// A JSON body for `POST /v1/run` on `isolation`.
fn run_body(isolation: Value) -> Value {
    json!({"isolation": isolation, "language": "python", "code": "print(2 + 2)"})
}

/// Asserts `reply` is a 422 with error code `code` whose message contains every one of `needles`.
fn assert_422(reply: &Reply, code: &str, needles: &[&str], what: &str) {
    assert_eq!(reply.status, 422, "{what}: {reply:?}");
    assert_eq!(reply.json["error"]["code"], code, "{what}: {reply:?}");
    let message = reply.json["error"]["message"].as_str().unwrap_or_default();
    for needle in needles {
        assert!(message.contains(needle), "{what}: the message should name {needle:?}: {message}");
    }
}

/// Creates a gVisor sandbox and a gVisor `/v1/run` with `isolation` and asserts both are 422 `code` naming `needles`,
/// and that the server created no sandbox for them.
fn assert_server_refuses(server: &Server, isolation: Value, code: &str, needles: &[&str]) {
    let spawner = spawner_of(server);
    let watch = RecordWatch::start();
    let create = server.call("POST", "/v1/sandboxes", KEY_1, Some(json!({ "isolation": isolation })));
    assert_422(&create, code, needles, &format!("POST /v1/sandboxes with isolation {isolation}"));
    let run = server.call("POST", "/v1/run", KEY_1, Some(run_body(isolation.clone())));
    assert_422(&run, code, needles, &format!("POST /v1/run with isolation {isolation}"));
    let created = watch.owned_by(spawner);
    assert!(created.is_empty(), "a refused isolation {isolation} created sandboxes on the host: {created:?}");
}

#[test]
fn misspelt_isolation_is_422_naming_the_allowed_values_on_create_and_run() {
    require_root!();
    let server = Server::start();
    for isolation in [json!("gvsior"), json!("GVISOR"), json!("")] {
        assert_server_refuses(&server, isolation, "unprocessable", &["process", "gvisor", "microvm", "auto"]);
    }
    let listed = server.call("GET", "/v1/sandboxes", KEY_1, None);
    assert_eq!(listed.json["sandboxes"].as_array().map(Vec::len), Some(0), "refused creates were listed: {listed:?}");
}

#[test]
fn auto_on_the_server_picks_gvisor_for_an_untrusted_tenant_and_says_why() {
    require_runsc!();
    let server = Server::start();
    let reply = server.call("POST", "/v1/sandboxes", KEY_1, Some(json!({"isolation": "auto"})));
    assert_eq!(reply.status, 201, "{reply:?}");
    // The default rules: an untrusted tenant's code (the default trust) goes to gVisor where it can run.
    assert_eq!(reply.json["isolation"]["tier"], "gvisor", "{reply:?}");
    let reason = reply.json["isolation"]["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("auto"), "the reason names the rule: {reason}");
    let id = reply.json["id"].as_str().expect("id").to_owned();
    let exec = server.exec(&id, "echo ok");
    assert_eq!(exec.json["stdout"], "ok\n");
    assert_eq!(exec.json["isolation"]["tier"], "gvisor", "{exec:?}");
    let deleted = server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert!(deleted.status < 300, "{deleted:?}");
}

#[test]
fn microvm_without_qemu_is_422_tier_unavailable_saying_how_to_install_it() {
    require_root!();
    let server = Server::start_with("[microvm]\nqemu = \"/nonexistent/qemu-system-x86_64\"\n");
    let needles = ["/nonexistent/qemu-system-x86_64", "not installed", "setup.sh"];
    assert_server_refuses(&server, json!("microvm"), "tier_unavailable", &needles);
}

#[test]
fn gvisor_without_runsc_is_422_tier_unavailable_saying_how_to_install_it() {
    require_root!();
    let server = Server::start_with("[gvisor]\nrunsc = \"/nonexistent/runsc\"\n");
    assert_server_refuses(&server, json!("gvisor"), "tier_unavailable", &["/nonexistent/runsc", "install", "setup.sh"]);
    // Positive control: the same server runs the process tier.
    let id = server.create(json!({"isolation": "process"}));
    assert_eq!(server.exec(&id, "echo ok").json["stdout"], "ok\n");
    let deleted = server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert!(deleted.status < 300, "{deleted:?}");
}

#[test]
fn a_runsc_removed_while_the_server_runs_is_422_tier_unavailable_and_coming_back_works_again() {
    require_runsc!();
    let dir = tempfile::tempdir().unwrap();
    let runsc = dir.path().join("runsc");
    let installed = Command::new("sh").args(["-c", "command -v runsc"]).output().unwrap();
    let installed = String::from_utf8_lossy(&installed.stdout).trim().to_owned();
    std::os::unix::fs::symlink(&installed, &runsc).unwrap();
    let server = Server::start_with(&format!("[gvisor]\nrunsc = \"{}\"\n", runsc.display()));
    let id = server.create(json!({"isolation": "gvisor"}));
    assert_eq!(server.exec(&id, "echo ok").json["stdout"], "ok\n", "positive control: runsc is there");
    assert!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status < 300);

    std::fs::remove_file(&runsc).unwrap();
    let runsc_name = runsc.display().to_string();
    assert_server_refuses(&server, json!("gvisor"), "tier_unavailable", &[&runsc_name, "setup.sh"]);

    std::os::unix::fs::symlink(&installed, &runsc).unwrap();
    let id = server.create(json!({"isolation": "gvisor"}));
    assert_eq!(server.exec(&id, "echo back").json["stdout"], "back\n", "runsc reinstalled: gVisor works again");
    assert!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status < 300);
}

/// Runs `sandkasten serve` on a config of `[[tenants]]` and `extra` that must not start: returns its exit code and
/// stderr (it is killed, and the test fails, if it is still running after 15 s).
fn serve_refusing_to_start(extra: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sandkasten.toml");
    std::fs::write(&config, format!("[[tenants]]\nname = \"t1\"\napi_keys = [\"{KEY_1}\"]\n\n{extra}\n")).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let _lock = shared_lock();
    let mut child = Command::new(bin())
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--config"])
        .arg(&config)
        .arg("--database")
        .arg(dir.path().join("sandkasten.db"))
        .env_remove("SANDKASTEN_API_KEYS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("sandkasten serve started on a config it should refuse:\n{extra}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    (status.code().unwrap_or(-1), stderr)
}

#[test]
fn a_gvisor_default_without_runsc_stops_the_server_at_start_saying_how_to_install_it() {
    require_root!();
    let (code, stderr) =
        serve_refusing_to_start("[defaults]\nisolation = \"gvisor\"\n\n[gvisor]\nrunsc = \"/nonexistent/runsc\"\n");
    assert_ne!(code, 0, "{stderr}");
    for needle in ["defaults.isolation", "/nonexistent/runsc", "install", "setup.sh"] {
        assert!(stderr.contains(needle), "the refusal should name {needle:?} (exit {code}): {stderr}");
    }
}

#[test]
fn an_unknown_gvisor_platform_stops_the_server_at_start_naming_the_platforms() {
    require_root!();
    let (code, stderr) = serve_refusing_to_start("[gvisor]\nplatform = \"kvm\"\n");
    assert_eq!(code, 2, "a config error is bad input: {stderr}");
    for needle in ["kvm", "systrap", "ptrace"] {
        assert!(stderr.contains(needle), "the refusal should name {needle:?}: {stderr}");
    }
}

/// A directory holding an executable `runsc` that notes each call in `calls`, waits a moment (so the sandbox it
/// was asked for exists for a while), says `FAKE_RUNSC_SAYS` on stderr and exits 1.
fn failing_runsc() -> (tempfile::TempDir, PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let calls = dir.path().join("calls");
    let runsc = dir.path().join("runsc");
    std::fs::write(
        &runsc,
        format!("#!/bin/sh\necho \"$@\" >> '{}'\nsleep 0.2\necho '{FAKE_RUNSC_SAYS}' >&2\nexit 1\n", calls.display()),
    )
    .unwrap();
    std::fs::set_permissions(&runsc, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, runsc, calls)
}

/// A server whose `[gvisor] runsc` is `failing_runsc`.
fn server_with_failing_runsc() -> (Server, tempfile::TempDir, PathBuf) {
    let (dir, runsc, calls) = failing_runsc();
    let server = Server::start_with(&format!("[gvisor]\nrunsc = \"{}\"\n", runsc.display()));
    (server, dir, calls)
}

/// `calls` was written to by the fake runsc: the runsc configured (or first on PATH) is the one that was started.
fn assert_called(calls: &Path) {
    let text = std::fs::read_to_string(calls).unwrap_or_default();
    assert!(
        text.contains(" run "),
        "the runsc configured (or first on PATH) was never asked to run the sandbox: {text:?}"
    );
}

/// Sends `body` to `path` on a server whose runsc fails; asserts the request fails, the sandbox it made (seen on the
/// host) is gone afterwards and nothing claims to run; returns the reply and how long it took.
fn request_with_failing_runsc(path: &str, body: Value) -> (Reply, Duration) {
    let (server, _dir, calls) = server_with_failing_runsc();
    let spawner = spawner_of(&server);
    let watch = RecordWatch::start();
    let started = Instant::now();
    let reply = server.call("POST", path, KEY_1, Some(body));
    let took = started.elapsed();
    let created = watch.owned_by(spawner);
    assert_called(&calls);
    assert!(!(200..300).contains(&reply.status), "POST {path} succeeded with a runsc that fails: {reply:?}");
    assert_eq!(created.len(), 1, "positive control: the failed create made one sandbox on the host first: {created:?}");
    assert_nothing_left_of(&created, &format!("a POST {path} whose runsc failed"));
    let listed = server.call("GET", "/v1/sandboxes", KEY_1, None);
    let running: Vec<&Value> = listed.json["sandboxes"]
        .as_array()
        .map(|list| list.iter().filter(|s| s["state"] == "running").collect())
        .unwrap_or_default();
    assert!(running.is_empty(), "a sandbox whose runsc failed is listed as running: {running:?}");
    (reply, took)
}

/// Asserts the error of `reply` says what runsc said.
fn assert_says_what_runsc_said(reply: &Reply, what: &str) {
    let message = reply.json["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(FAKE_RUNSC_SAYS),
        "{what} failed with HTTP {} {:?} but the error does not say what runsc said ({FAKE_RUNSC_SAYS:?}): {message:?}",
        reply.status,
        reply.json["error"]["code"]
    );
}

#[test]
fn a_runsc_that_fails_to_start_fails_the_create_with_what_runsc_said_and_leaves_nothing() {
    require_runsc!();
    let (reply, _) = request_with_failing_runsc("/v1/sandboxes", json!({"isolation": "gvisor"}));
    assert_says_what_runsc_said(&reply, "POST /v1/sandboxes");
}

#[test]
fn a_runsc_that_fails_to_start_fails_v1_run_with_what_runsc_said_and_leaves_nothing() {
    require_runsc!();
    let (reply, _) = request_with_failing_runsc("/v1/run", run_body(json!("gvisor")));
    assert_says_what_runsc_said(&reply, "POST /v1/run");
}

#[test]
fn a_runsc_that_exits_at_once_fails_the_create_within_seconds_not_at_the_ready_timeout() {
    require_runsc!();
    let (reply, took) = request_with_failing_runsc("/v1/sandboxes", json!({"isolation": "gvisor"}));
    // The fake runsc exits 0.2 s after it starts; the agent's channel closes with it.
    assert!(
        took < Duration::from_secs(5),
        "a runsc that exited after 0.2 s was answered after {took:?} (HTTP {}): the failure should be seen when \
         runsc exits, not when the agent's ready timeout runs out",
        reply.status
    );
}

// ---------------------------------------------------------------------------------------------------------------------
// The CLI
// ---------------------------------------------------------------------------------------------------------------------

/// Runs `sandkasten <args>` (with `env`) holding the suite lock exclusively; asserts exit 2, every one of `needles`
/// on stderr, nothing on stdout and no sandbox created. With `one_line`, the message is one line (clap's usage
/// errors are several).
fn assert_cli_refuses(args: &[&str], env: &[(&str, &str)], needles: &[&str], one_line: bool) {
    let _lock = exclusive_lock();
    let before = host_sandbox_ids();
    let mut cli = Cli::new(args.iter().copied());
    for (key, value) in env {
        cli = cli.env(key, value);
    }
    let out = cli.output_unlocked();
    let after = host_sandbox_ids();
    assert_eq!(out.code, 2, "`sandkasten {}` must exit 2\n{}", args.join(" "), out.describe());
    let stderr = out.stderr_text();
    for needle in needles {
        assert!(stderr.contains(needle), "stderr should name {needle:?}\n{}", out.describe());
    }
    if one_line {
        let lines = stderr.lines().filter(|l| !l.trim().is_empty()).count();
        assert_eq!(lines, 1, "a one-line error expected\n{}", out.describe());
    }
    assert!(out.stdout.is_empty(), "nothing on stdout\n{}", out.describe());
    let created = created_by(out.pid, &before, &after);
    assert!(created.is_empty(), "`sandkasten {}` created host state: {created:?}", args.join(" "));
    let new_gvisor: Vec<String> =
        after.difference(&before).filter(|id| !gvisor_leftovers(id).is_empty()).cloned().collect();
    let mine: Vec<&String> =
        new_gvisor.iter().filter(|id| record_owner(id).is_none_or(|o| o == u64::from(out.pid))).collect();
    assert!(mine.is_empty(), "`sandkasten {}` left gVisor state: {mine:?}", args.join(" "));
}

#[test]
fn misspelt_isolation_is_a_usage_error_exit_2_naming_the_tiers() {
    require_root!();
    let tiers = ["process", "gvisor", "microvm", "auto"];
    for misspelt in ["gvsior", "GVISOR", ""] {
        let mut needles = vec!["--isolation"];
        needles.extend(tiers);
        assert_cli_refuses(&["run", "--isolation", misspelt, "--", "/bin/true"], &[], &needles, false);
        assert_cli_refuses(&["run", "--json", "--isolation", misspelt, "--", "/bin/true"], &[], &needles, false);
        assert_cli_refuses(&["sandbox", "create", "--isolation", misspelt], &[], &needles, false);
    }
}

#[test]
fn a_local_auto_with_no_strong_tier_usable_exits_2_saying_why_each_was_skipped() {
    require_root!();
    // An untrusted run (the default trust) may go to gvisor or microvm only; with neither installed, none is usable.
    let path = [("PATH", "/nonexistent/bin")];
    let needles = ["auto", "none is usable", "gvisor skipped", "runsc", "microvm skipped", "QEMU", "setup.sh"];
    assert_cli_refuses(&["run", "--isolation", "auto", "--", "/bin/true"], &path, &needles, true);
    assert_cli_refuses(&["run", "--json", "--isolation", "auto", "--", "/bin/true"], &path, &needles, true);
}

#[test]
fn microvm_without_qemu_on_path_exits_2_saying_how_to_install_it() {
    require_root!();
    let path = [("PATH", "/nonexistent/bin")];
    let needles = ["QEMU", "not installed", "setup.sh"];
    assert_cli_refuses(&["run", "--isolation", "microvm", "--", "/bin/true"], &path, &needles, true);
    assert_cli_refuses(&["run", "--json", "--isolation", "microvm", "--", "/bin/true"], &path, &needles, true);
}

#[test]
fn gvisor_without_runsc_on_path_exits_2_saying_how_to_install_it_and_creates_nothing() {
    require_root!();
    let path = [("PATH", "/nonexistent/bin")];
    let needles = ["runsc", "not installed", "install", "setup.sh"];
    assert_cli_refuses(&["run", "--isolation", "gvisor", "--", "/bin/true"], &path, &needles, true);
    assert_cli_refuses(
        &["run", "--json", "--isolation", "gvisor", "--lang", "python", "--code", "1"],
        &path,
        &needles,
        true,
    );
}

#[test]
fn a_runsc_that_fails_to_start_makes_run_exit_125_with_what_runsc_said_and_leaves_nothing() {
    require_runsc!();
    use std::os::unix::fs::PermissionsExt;
    // `sandkasten run` takes runsc from PATH (a PATH without it exits 2, above): first on PATH here is a wrapper that
    // runs the real runsc on a platform that does not exist. What runsc says must reach the user.
    let dir = tempfile::tempdir().unwrap();
    let (runsc, calls) = (dir.path().join("runsc"), dir.path().join("calls"));
    let swap_platform = "\"${@/--platform=systrap/--platform=no-such-platform}\"";
    std::fs::write(
        &runsc,
        format!("#!/bin/bash\necho \"$@\" >> '{}'\nexec {RUNSC} {swap_platform}\n", calls.display()),
    )
    .unwrap();
    std::fs::set_permissions(&runsc, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:/usr/bin:/bin", dir.path().display());
    let watch = RecordWatch::start();
    let out = gvisor_run(["--", "/bin/true"]).env("PATH", &path).output();
    let created = watch.owned_by(out.pid);
    assert_called(&calls);
    assert_eq!(out.code, 125, "a sandbox that could not start is a sandbox error\n{}", out.describe());
    assert!(
        out.stderr_text().contains("runsc") && out.stderr_text().contains("no-such-platform"),
        "the error should say what runsc said\n{}",
        out.describe()
    );
    assert_eq!(created.len(), 1, "positive control: the run made its sandbox before runsc failed: {created:?}");
    assert_nothing_left_of(&created, "a run whose runsc failed");
}
