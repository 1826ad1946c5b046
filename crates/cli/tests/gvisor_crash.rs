//! Crashes around gVisor sandboxes, asserted on the host: `kill -9` of the server while gVisor sandboxes run and
//! while several gVisor creates are in flight (alone, or together with its spawner), `kill -9` of the spawner alone,
//! and `kill -9` of a one-shot `sandkasten run --isolation gvisor` (while it runs, and while runsc is starting).
//! Afterwards — once the server is restarted on the same state, or `sandkasten gc` or the next run has collected —
//! no record, cgroup, bundle, runsc state entry (`ID_sandbox:ID.state`, `.lock`, `runsc-ID.sock`), runsc /
//! runsc-sandbox / runsc-gofer process or mount of any of those sandboxes remains, and the database says each
//! sandbox the server had answered for is lost. And a `gc` collecting such leftovers leaves alone a gVisor sandbox
//! that is being created at the same moment.
//!
//! Every sandbox is found on the host, not from the server's answers: a watcher polls the record directory through
//! the whole test and collects every sandbox whose record names the server's spawner (one-shot runs are found by a
//! marker in their code), so creates that never answered (killed mid-way) are checked too. Each test holds the
//! suite lock exclusively: leftovers of a crash are collected by the next spawner or `gc`, and no other test's run
//! may collect them first.

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use serve::{KEY_1, Server, spawner_of, wait_until_dead};

/// How many creates are started at once when the crash comes.
const CREATES_IN_FLIGHT: usize = 4;

/// Watches the record directory and keeps every sandbox whose record names `owner` (the server's spawner). A
/// sandbox's record is written before anything else of it and removed last, so this sees every sandbox the server
/// started, even one killed a moment later, and none of other processes' sandboxes.
struct HostWatch {
    seen: Arc<Mutex<BTreeSet<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HostWatch {
    fn start(owner: u32) -> HostWatch {
        let seen = Arc::new(Mutex::new(BTreeSet::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (seen, stop) = (Arc::clone(&seen), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for name in dir_names(RECORD_DIR) {
                        let Some(id) = name.strip_suffix(".json") else { continue };
                        if record_owner(id) == Some(u64::from(owner)) {
                            seen.lock().unwrap().insert(id.to_owned());
                        }
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        };
        HostWatch { seen, stop, thread: Some(thread) }
    }

    /// The sandboxes seen so far.
    fn seen(&self) -> BTreeSet<String> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until at least `count` sandboxes besides `known` have been seen (up to 15 s).
    fn wait_for_new(&self, known: &[String], count: usize) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let new: BTreeSet<String> = self.seen().into_iter().filter(|id| !known.contains(id)).collect();
            if new.len() >= count {
                return;
            }
            assert!(Instant::now() < deadline, "{count} new sandboxes did not appear on the host; saw {new:?}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Stops watching; returns every sandbox seen.
    fn finish(mut self) -> BTreeSet<String> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
        self.seen()
    }
}

impl Drop for HostWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Host processes of sandbox `id`: runsc and its re-executions naming it, and anything in its cgroup.
fn processes_of(id: &str) -> Vec<String> {
    let mut found: Vec<String> =
        runsc_processes(id).into_iter().map(|(pid, line)| format!("pid {pid}: {}", excerpt(&line, 160))).collect();
    found.extend(
        processes_in_cgroup_matching(id)
            .into_iter()
            .map(|(pid, _)| format!("pid {pid} in its cgroup: {}", excerpt(&cmdline(pid), 160))),
    );
    found
}

/// Waits (up to 10 s) until no process of any of `ids` runs.
fn assert_no_processes_of(ids: &BTreeSet<String>, when: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<String> = ids.iter().flat_map(|id| processes_of(id)).collect();
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "gVisor sandbox processes still run {when}:\n  {}", left.join("\n  "));
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (up to 10 s) until none of `ids` has anything left on the host (`gvisor_leftovers`).
fn assert_nothing_left_of(ids: &BTreeSet<String>, when: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<String> = ids.iter().flat_map(|id| gvisor_leftovers(id)).collect();
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "gVisor sandboxes left host state {when}:\n  {}", left.join("\n  "));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A create of a gVisor sandbox as t1 on its own connection, in a thread; yields the status (or the transport error).
fn create_in_background(url: &str) -> JoinHandle<Result<u16, String>> {
    let url = url.to_owned();
    std::thread::spawn(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        agent
            .post(format!("{url}/v1/sandboxes"))
            .header("Authorization", format!("Bearer {KEY_1}"))
            .send_json(json!({"isolation": "gvisor"}))
            .map(|reply| reply.status().as_u16())
            .map_err(|e| e.to_string())
    })
}

/// A long command in sandbox `id`, in a thread (it ends when the sandbox or the server dies).
fn busy_in_background(url: &str, id: &str) -> JoinHandle<()> {
    let (url, id) = (url.to_owned(), id.to_owned());
    std::thread::spawn(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let _ = agent
            .post(format!("{url}/v1/sandboxes/{id}/exec"))
            .header("Authorization", format!("Bearer {KEY_1}"))
            .send_json(json!({"cmd": "sleep 30"}));
    })
}

/// Two running gVisor sandboxes (one busy), then `CREATES_IN_FLIGHT` creates at once; once the second of those is
/// being built on the host, the crash: `kill -9` of the server (and first its spawner, with `kill_spawner_too`).
/// Returns the server (stopped), the sandboxes that answered 201 before the crash, and every id seen on the host.
fn crash_during_gvisor_creates(kill_spawner_too: bool) -> (Server, Vec<String>, BTreeSet<String>) {
    let mut server = Server::start_exclusive();
    let spawner = spawner_of(&server);
    let watch = HostWatch::start(spawner);
    let running: Vec<String> = (0..2).map(|_| server.create(json!({"isolation": "gvisor"}))).collect();
    for id in &running {
        assert!(!runsc_processes(id).is_empty(), "positive control: sandbox {id} runs under runsc");
    }
    let busy = busy_in_background(&server.url, &running[0]);
    std::thread::sleep(Duration::from_millis(300));
    let creates: Vec<_> = (0..CREATES_IN_FLIGHT).map(|_| create_in_background(&server.url)).collect();
    // The spawner builds one sandbox at a time: crash while the second is being built (the first is done or nearly,
    // the rest still wait in the server).
    watch.wait_for_new(&running, 2);
    std::thread::sleep(Duration::from_millis(40));
    assert_eq!(spawner_of(&server), spawner, "the spawner is the one the server started with");
    if kill_spawner_too {
        // SAFETY: kill(2) of the spawner, a child of our child, just listed.
        unsafe { libc::kill(spawner as libc::pid_t, libc::SIGKILL) };
    }
    server.stop_with(libc::SIGKILL);
    wait_until_dead(spawner);
    let outcomes: Vec<Result<u16, String>> = creates.into_iter().map(|c| c.join().unwrap()).collect();
    busy.join().unwrap();
    let seen = watch.finish();
    assert!(
        seen.len() >= running.len() + 2,
        "positive control: the running sandboxes and at least two in-flight creates were seen on the host: {seen:?} \
         (create outcomes: {outcomes:?})"
    );
    (server, running, seen)
}

/// After the crash: no process of any sandbox seen survives its owner; after a restart on the same database nothing
/// of them is left on the host, the database says the ones that had answered are lost (none of the others claims
/// to run), and the restarted server creates and runs gVisor sandboxes.
fn assert_recovered(mut server: Server, running: &[String], seen: &BTreeSet<String>) {
    assert_no_processes_of(seen, "after the crash (before any restart)");
    server.relaunch();
    assert_nothing_left_of(seen, "after the restart");
    for id in seen {
        let info = server.call("GET", &format!("/v1/sandboxes/{id}"), KEY_1, None);
        if running.contains(id) {
            assert_eq!(info.status, 200, "the record of {id} survived the crash: {info:?}");
            assert_eq!(info.json["state"], "lost", "{info:?}");
        } else {
            assert_ne!(info.json["state"], "running", "a create killed mid-way claims to run: {info:?}");
        }
    }
    let id = server.create(json!({"isolation": "gvisor"}));
    assert_eq!(server.exec(&id, "echo alive").json["stdout"], "alive\n");
    let deleted = server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert!(deleted.status < 300, "{deleted:?}");
    assert_no_gvisor_leaks(&id);
}

#[test]
fn kill_9_of_the_server_during_gvisor_creates_leaves_nothing_after_restart() {
    require_runsc!();
    let (server, running, seen) = crash_during_gvisor_creates(false);
    assert_recovered(server, &running, &seen);
}

#[test]
fn kill_9_of_server_and_spawner_during_gvisor_creates_leaves_nothing_after_restart() {
    require_runsc!();
    let (server, running, seen) = crash_during_gvisor_creates(true);
    assert_recovered(server, &running, &seen);
}

#[test]
fn kill_9_of_the_spawner_alone_kills_every_gvisor_process_and_restart_removes_the_rest() {
    require_runsc!();
    let mut server = Server::start_exclusive();
    let spawner = spawner_of(&server);
    let watch = HostWatch::start(spawner);
    let running: Vec<String> = (0..2).map(|_| server.create(json!({"isolation": "gvisor"}))).collect();
    let busy = busy_in_background(&server.url, &running[0]);
    std::thread::sleep(Duration::from_millis(300));
    let creates: Vec<_> = (0..CREATES_IN_FLIGHT).map(|_| create_in_background(&server.url)).collect();
    watch.wait_for_new(&running, 1);
    std::thread::sleep(Duration::from_millis(40));
    // SAFETY: kill(2) of the spawner, a child of our child, just listed.
    unsafe { libc::kill(spawner as libc::pid_t, libc::SIGKILL) };
    wait_until_dead(spawner);
    let outcomes: Vec<Result<u16, String>> = creates.into_iter().map(|c| c.join().unwrap()).collect();
    busy.join().unwrap();
    let seen = watch.finish();
    assert!(seen.len() > running.len(), "positive control: an in-flight create was seen on the host: {seen:?}");
    // runsc dies with the spawner (parent-death signal), the Sentry and the gofer with runsc.
    assert_no_processes_of(&seen, "after the spawner was killed");
    eprintln!("creates in flight when the spawner died: {outcomes:?}");
    assert!(!outcomes.contains(&Ok(500)), "a create in flight when the spawner died was a 500: {outcomes:?}");
    // The server itself survives its spawner: it says the spawner is down (503 with the reason) until it has
    // restarted it, then it is healthy again.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let health = server.call("GET", "/healthz", KEY_1, None);
        match health.status {
            200 => break,
            503 => assert!(health.json["reason"].as_str().unwrap_or_default().contains("spawner"), "{health:?}"),
            _ => panic!("/healthz after the spawner died: {health:?}"),
        }
        assert!(std::time::Instant::now() < deadline, "the spawner was not restarted: {health:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    server.restart();
    assert_nothing_left_of(&seen, "after the server was restarted");
    for id in &running {
        let info = server.call("GET", &format!("/v1/sandboxes/{id}"), KEY_1, None);
        assert_eq!(info.json["state"], "lost", "{info:?}");
    }
    let id = server.create(json!({"isolation": "gvisor"}));
    assert_eq!(server.exec(&id, "echo alive").json["stdout"], "alive\n");
}

/// A one-shot `sandkasten run --isolation gvisor` of bash `code` (which carries `marker`), started directly.
fn start_one_shot(marker: &str, code: &str) -> std::process::Child {
    Command::new(bin())
        .args(["run", "--isolation", "gvisor", "--timeout", "30s", "--lang", "bash", "--code"])
        .arg(format!("# {marker}\n{code}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start sandkasten run")
}

/// Kills a one-shot run with SIGKILL and reaps it.
fn kill_9(mut cli: std::process::Child) {
    // SAFETY: kill(2) of our own, not yet reaped child.
    unsafe { libc::kill(cli.id() as libc::pid_t, libc::SIGKILL) };
    cli.wait().unwrap();
}

/// Starts a one-shot gVisor run of `sleep 20`, waits until its program runs (runsc, the Sentry and the gofer are up
/// and the guest's `sleep` has started), kills the CLI with SIGKILL, and returns the sandbox's id once its processes
/// are dead (they die with the CLI) — its record, cgroup, bundle and runsc state are still there.
fn one_shot_killed_mid_run() -> String {
    let marker = unique_token("GVCRASH");
    let cli = start_one_shot(&marker, "echo started > /tmp/started\nsleep 20");
    let id = gvisor_sandbox_with_code(&marker, Duration::from_secs(15));
    let Some(id) = id else {
        kill_9(cli);
        panic!("the one-shot run's bundle did not appear under {GVISOR_BUNDLES}");
    };
    // Running: the Sentry and the gofer are up, and the agent has had time to start the program.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let argv0s: Vec<String> = runsc_processes(&id)
            .into_iter()
            .filter_map(|(_, line)| line.split_whitespace().next().map(str::to_owned))
            .collect();
        if argv0s.iter().any(|a| a.ends_with("runsc-sandbox")) && argv0s.iter().any(|a| a.ends_with("runsc-gofer")) {
            break;
        }
        assert!(Instant::now() < deadline, "sandbox {id} never had a Sentry and a gofer: {argv0s:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(500));
    kill_9(cli);
    assert_no_processes_of(&BTreeSet::from([id.clone()]), "after the one-shot CLI was killed");
    let left = gvisor_leftovers(&id);
    assert!(
        left.iter().any(|l| l.contains("record")) && left.iter().any(|l| l.contains("bundle")),
        "positive control: a killed one-shot leaves its record and bundle for gc: {left:?}"
    );
    id
}

#[test]
fn gc_after_kill_9_of_a_one_shot_gvisor_run_removes_everything() {
    require_runsc!();
    let _lock = exclusive_lock();
    let id = one_shot_killed_mid_run();
    let gc = Cli::new(["gc"]).output_unlocked();
    assert_eq!(gc.code, 0, "{}", gc.describe());
    assert!(gc.stdout_text().contains(&id), "gc should name the sandbox it removed\n{}", gc.describe());
    assert_nothing_left_of(&BTreeSet::from([id]), "after sandkasten gc");
}

#[test]
fn the_next_run_after_kill_9_of_a_one_shot_gvisor_run_removes_everything() {
    require_runsc!();
    let _lock = exclusive_lock();
    let id = one_shot_killed_mid_run();
    let next = gvisor_run(["--json", "--", "/bin/true"]).output_unlocked();
    let result = RunResult::parse(next);
    result.assert_exit(0);
    assert_nothing_left_of(&BTreeSet::from([id, result.id()]), "after the next run");
}

#[test]
fn gc_after_kill_9_of_a_one_shot_gvisor_run_while_runsc_starts_removes_everything() {
    require_runsc!();
    let _lock = exclusive_lock();
    // The code file is written into the bundle just before runsc starts: kill at several points of its start-up.
    let mut ids = BTreeSet::new();
    for delay_ms in [0, 40, 120] {
        let marker = unique_token("GVSTART");
        let cli = start_one_shot(&marker, "sleep 20");
        let id = gvisor_sandbox_with_code(&marker, Duration::from_secs(15));
        std::thread::sleep(Duration::from_millis(delay_ms));
        kill_9(cli);
        ids.insert(id.unwrap_or_else(|| panic!("the one-shot run's bundle did not appear (delay {delay_ms} ms)")));
    }
    assert_no_processes_of(&ids, "after the one-shot CLIs were killed during runsc's start");
    let gc = Cli::new(["gc"]).output_unlocked();
    assert_eq!(gc.code, 0, "{}", gc.describe());
    assert_nothing_left_of(&ids, "after sandkasten gc");
}

/// `count` leftovers of crashed owners: a record naming a dead owner, and cgroups in every v1 controller that is
/// mounted (what `gc` spends its time on before it looks at gVisor bundles and runsc state).
fn make_stale_sandboxes(count: usize) {
    let mut dead = Command::new("/bin/true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    std::fs::create_dir_all(RECORD_DIR).unwrap();
    for _ in 0..count {
        let hex: String = unique_token("").chars().filter(char::is_ascii_hexdigit).collect();
        let id = format!("sb-{:0>16}", &hex[hex.len().saturating_sub(16)..]);
        for controller in V1_CONTROLLERS {
            let root = std::path::PathBuf::from(format!("/sys/fs/cgroup/{controller}"));
            if root.join("cgroup.procs").exists() {
                let _ = std::fs::create_dir_all(root.join("sandkasten").join(&id));
            }
        }
        let record = json!({
            "id": id, "tier": "process", "owner_pid": dead_pid, "owner_start_ticks": 1,
            "cgroup_parent": "sandkasten", "created_unix_ms": 0u64,
        });
        std::fs::write(record_path(&id), record.to_string()).unwrap();
    }
}

#[test]
fn gc_collecting_leftovers_never_removes_a_gvisor_sandbox_being_created() {
    require_runsc!();
    let _lock = exclusive_lock();
    // A `gc` (the command, or the one every run starts when it sees stale records) busy with crashed owners'
    // leftovers while a gVisor run creates its sandbox: the new sandbox's bundle and runsc state belong to a live
    // owner and must survive. The race window is tens of milliseconds: several rounds, the run started at
    // different moments of the gc.
    let mut harmed = Vec::new();
    for round in 0..16u64 {
        make_stale_sandboxes(60);
        let gc = std::thread::spawn(|| Cli::new(["gc"]).output_unlocked());
        std::thread::sleep(Duration::from_millis(round % 6 * 8));
        // A run takes well under a second here; one that is still running after 10 s is killed (and reported).
        let run = std::thread::spawn(|| {
            gvisor_run(["--json", "--", "/bin/echo", "ok"]).watchdog(Duration::from_secs(10)).output_unlocked()
        })
        .join();
        let gc = gc.join().unwrap();
        let gc_said = format!("{}{}", gc.stdout_text(), gc.stderr_text());
        match run {
            Err(_) => {
                harmed.push(format!("round {round}: the run hung (see the watchdog above)\n--- gc ---\n{gc_said}"))
            }
            Ok(run) if run.code != 0 => {
                harmed.push(format!("round {round}: the run failed\n{}\n--- gc ---\n{gc_said}", run.describe()));
            }
            Ok(run) => {
                let id = RunResult::parse(run).id();
                if gc_said.contains(&id) {
                    harmed.push(format!("round {round}: gc went for the live sandbox {id}:\n{gc_said}"));
                }
                assert_no_gvisor_leaks(&id);
            }
        }
        if !harmed.is_empty() {
            break;
        }
    }
    let gc = Cli::new(["gc"]).output_unlocked();
    assert_eq!(gc.code, 0, "{}", gc.describe());
    assert!(harmed.is_empty(), "gc removed state of a gVisor sandbox being created:\n{}", harmed.join("\n\n"));
}
