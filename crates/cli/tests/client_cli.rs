//! The CLI client (`sandkasten sandbox …`) and `POST /v1/run` against a real `sandkasten serve`: create, exec with
//! exit-code passthrough, code cells with persistent state, cp in and out (bytes identical), list and info per
//! tenant, rm; a one-shot run of Python and a C compile error over HTTP. Afterwards the server is stopped with SIGTERM and nothing of the sandboxes remains.
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Cli, Output, Tier};

per_tier!(the_client_drives_a_sandbox_from_create_to_rm, one_shot_runs_over_http_leave_nothing_behind);
use serde_json::{Value, json};

const KEY_1: &str = "client-test-key-tenant-one-0001";
const KEY_2: &str = "client-test-key-tenant-two-0002";

/// A `sandkasten serve` on a free loopback port, stopped with SIGTERM when dropped.
struct Server {
    child: Option<Child>,
    url: String,
    _dir: tempfile::TempDir,
}

impl Server {
    /// A server whose creates that name no tier get `tier` (`[defaults] isolation`).
    fn start_on(tier: Tier) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let config = dir.path().join("sandkasten.toml");
        std::fs::write(&config, format!("[defaults]\nisolation = \"{tier}\"\n")).unwrap();
        let child = Command::new(common::bin())
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--config"])
            .arg(&config)
            .arg("--database")
            .arg(dir.path().join("sandkasten.db"))
            .env("SANDKASTEN_API_KEYS", format!("t1:{KEY_1},t2:{KEY_2}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let server = Server { child: Some(child), url: format!("http://127.0.0.1:{port}"), _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        while http().get(format!("{}/healthz", server.url)).call().map(|r| r.status().as_u16()).ok() != Some(200) {
            assert!(Instant::now() < deadline, "the server did not become healthy at {}", server.url);
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// Sends SIGTERM and waits for the server to exit (SIGKILL after 20 s); returns its exit code.
    fn stop(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `sandkasten sandbox ARGS…` as tenant `key`.
    fn cli(&self, key: &str, args: &[&str]) -> Cli {
        let mut all = vec!["sandbox"];
        all.extend_from_slice(args);
        Cli::new(all).env("SANDKASTEN_URL", &self.url).env("SANDKASTEN_API_KEY", key)
    }

    fn run(&self, key: &str, args: &[&str]) -> Output {
        self.cli(key, args).output_unlocked()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn http() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

#[track_caller]
fn expect_code(output: &Output, code: i32) {
    assert_eq!(output.code, code, "{}", output.describe());
}

/// The sandbox id in a process's cgroup path (`…/sandkasten/sb-…`), if it is in one.
fn sandbox_of(pid: u32) -> Option<String> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let at = cgroups.find("sandkasten/sb-")? + "sandkasten/".len();
    Some(cgroups[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect())
}

/// After the server stopped: no sandbox process (uid ≥ 1 000 000 000) and nothing of `ids` on the host.
fn assert_nothing_left(tier: Tier, ids: &[String]) {
    for id in ids {
        let cgroups: Vec<_> = common::cgroup_paths(id).into_iter().filter(|p| p.exists()).collect();
        assert!(cgroups.is_empty(), "cgroups of {id} left: {cgroups:?}");
        common::assert_gone(tier, id);
    }
    // Other test binaries may run sandboxes right now: look while holding the suite lock exclusively, and give
    // processes of other servers' live sandboxes (in a cgroup of a sandbox that is not ours) time to end.
    let _lock = common::exclusive_lock();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<(u32, Option<String>)> = common::host_pids()
            .into_iter()
            .filter(|pid| common::process_uid(*pid).is_some_and(|uid| uid >= common::SANDBOX_UID_BASE))
            .map(|pid| (pid, sandbox_of(pid)))
            .collect();
        if left.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            let ours_or_escaped: Vec<_> =
                left.iter().filter(|(_, sandbox)| sandbox.as_ref().is_none_or(|id| ids.contains(id))).collect();
            assert!(ours_or_escaped.is_empty(), "sandbox processes left: {ours_or_escaped:?}");
            eprintln!("note: processes of other servers' sandboxes are running: {left:?}");
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn the_client_drives_a_sandbox_from_create_to_rm(tier: Tier) {
    let lock = common::shared_lock();
    let mut server = Server::start_on(tier);

    let create = ["create", "--isolation", tier.name(), "--metadata", "purpose=client-test", "--env", "GREETING=hallo"];
    let created = server.run(KEY_1, &create);
    expect_code(&created, 0);
    let id = created.stdout_text().trim().to_owned();
    assert!(id.starts_with("sb-") && id.len() == 19, "create prints the id: {}", created.describe());

    let hi = server.run(KEY_1, &["exec", &id, "--", "echo", "hi"]);
    expect_code(&hi, 0);
    assert_eq!(hi.stdout_text(), "hi\n");
    let both = server.run(KEY_1, &["exec", &id, "--", "sh", "-c", "echo $GREETING; echo oops >&2; exit 3"]);
    expect_code(&both, 3);
    assert_eq!((both.stdout_text().as_str(), both.stderr_text().as_str()), ("hallo\n", "oops\n"));
    let json = server.run(KEY_1, &["exec", "--json", &id, "--", "sh", "-c", "exit 4"]);
    expect_code(&json, 4);
    let result: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!((result["exit_code"].clone(), result["sandbox_id"].clone()), (json!(4), json!(id)));
    let fed = server.cli(KEY_1, &["exec", &id, "--", "cat"]).stdin("fed through\n").output_unlocked();
    assert_eq!(fed.stdout_text(), "fed through\n", "{}", fed.describe());

    expect_code(&server.run(KEY_1, &["code", &id, "--lang", "python", "--code", "x = 41"]), 0);
    let cell = server.run(KEY_1, &["code", &id, "--lang", "python", "--code", "x + 1"]);
    expect_code(&cell, 0);
    assert_eq!(cell.stdout_text(), "42\n", "interpreter state persists: {}", cell.describe());
    let raised = server.run(KEY_1, &["code", &id, "--lang", "python", "--code", "1/0"]);
    expect_code(&raised, 1);
    assert!(raised.stderr_text().contains("ZeroDivisionError"), "{}", raised.describe());

    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("blob.bin");
    let bytes: Vec<u8> = (0..=255u8).rev().cycle().take(70_000).collect();
    std::fs::write(&local, &bytes).unwrap();
    let remote = format!("{id}:/workspace/blob.bin");
    expect_code(&server.run(KEY_1, &["cp", local.to_str().unwrap(), &remote]), 0);
    let size = server.run(KEY_1, &["exec", &id, "--", "sh", "-c", "wc -c < blob.bin"]);
    assert_eq!(size.stdout_text(), "70000\n", "{}", size.describe());
    let back = dir.path().join("back.bin");
    expect_code(&server.run(KEY_1, &["cp", &remote, back.to_str().unwrap()]), 0);
    assert!(std::fs::read(&back).unwrap() == bytes, "the file came back byte for byte");
    let piped =
        server.cli(KEY_1, &["cp", "-", &format!("{id}:piped.txt")]).stdin(vec![0xff, 0, b'x']).output_unlocked();
    expect_code(&piped, 0);
    let out = server.run(KEY_1, &["cp", &format!("{id}:/workspace/piped.txt"), "-"]);
    assert_eq!(out.stdout, [0xff, 0, b'x'], "{}", out.describe());

    let listed = server.run(KEY_1, &["list"]);
    expect_code(&listed, 0);
    assert!(listed.stdout_text().starts_with("ID ") && listed.stdout_text().contains(&id), "{}", listed.describe());
    let filtered = server.run(KEY_1, &["list", "--json", "--metadata", "purpose=client-test"]);
    let filtered: Value = serde_json::from_slice(&filtered.stdout).unwrap();
    assert_eq!(filtered["sandboxes"][0]["id"], json!(id));
    // One sandbox per request: the client follows the cursor and lists both, oldest first.
    let second = server.run(KEY_1, &["create", "--isolation", tier.name(), "--metadata", "purpose=client-test"]);
    expect_code(&second, 0);
    let second = second.stdout_text().trim().to_owned();
    let paged = server.run(KEY_1, &["list", "--json", "--page-size", "1", "--metadata", "purpose=client-test"]);
    expect_code(&paged, 0);
    let paged: Value = serde_json::from_slice(&paged.stdout).unwrap();
    let paged: Vec<&str> = paged["sandboxes"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(paged, [id.as_str(), second.as_str()]);
    expect_code(&server.run(KEY_1, &["list", "--page-size", "0"]), 2);
    expect_code(&server.run(KEY_1, &["rm", &second]), 0);
    common::assert_gone(tier, &second);
    let info = server.run(KEY_1, &["info", &id]);
    expect_code(&info, 0);
    assert!(info.stdout_text().contains("state:") && info.stdout_text().contains("running"), "{}", info.describe());

    let other = server.run(KEY_2, &["list"]);
    expect_code(&other, 0);
    assert!(!other.stdout_text().contains(&id), "another tenant's list: {}", other.describe());
    let other_info = server.run(KEY_2, &["info", &id]);
    expect_code(&other_info, 2);
    assert!(other_info.stderr_text().starts_with("sandkasten: ") && other_info.stderr_text().contains("not found"));
    expect_code(&server.run(KEY_2, &["exec", &id, "--", "true"]), 2);
    expect_code(&server.run(KEY_2, &["rm", &id]), 2);
    let no_key = server.run("", &["list"]);
    expect_code(&no_key, 2);
    assert!(no_key.stderr_text().contains("SANDKASTEN_API_KEY"), "{}", no_key.describe());

    let removed = server.run(KEY_1, &["rm", &id]);
    expect_code(&removed, 0);
    let after = server.run(KEY_1, &["info", &id]);
    expect_code(&after, 0);
    assert!(after.stdout_text().contains("destroyed"), "info after rm: {}", after.describe());
    let exec_after = server.run(KEY_1, &["exec", &id, "--", "true"]);
    expect_code(&exec_after, 2);
    assert!(exec_after.stderr_text().contains("no longer be used"), "{}", exec_after.describe());
    let running = server.run(KEY_1, &["list", "--json"]);
    assert_eq!(serde_json::from_slice::<Value>(&running.stdout).unwrap()["sandboxes"], json!([]));
    common::assert_gone(tier, &id);

    assert_eq!(server.stop(), Some(0), "the server exits cleanly on SIGTERM");
    let down = Cli::new(["sandbox", "list"]).env("SANDKASTEN_URL", &server.url).output_unlocked();
    expect_code(&down, 125);
    assert!(down.stderr_text().contains(&server.url) && down.stderr_text().contains("running"), "{}", down.describe());
    drop(lock);
    assert_nothing_left(tier, &[id]);
}

fn one_shot_runs_over_http_leave_nothing_behind(tier: Tier) {
    let lock = common::shared_lock();
    let mut server = Server::start_on(tier);
    let post_run = |body: Value| -> Value {
        let mut body = body;
        body["isolation"] = json!(tier.name());
        let mut response = http()
            .post(format!("{}/v1/run", server.url))
            .header("Authorization", format!("Bearer {KEY_1}"))
            .send_json(body)
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        let result: Value = response.body_mut().read_json().unwrap();
        assert_eq!(result["isolation"]["tier"], tier.name(), "the run's sandbox is of the tier asked for: {result}");
        result
    };

    let python = post_run(json!({"language": "python", "code": "print(2 + 2)"}));
    assert_eq!(python["stdout"], "4\n", "{python}");
    assert_eq!(python["exit_code"], 0);
    let broken = post_run(json!({"language": "c", "code": "int main( {"}));
    assert_eq!(broken["error"]["code"], "compile_error", "{broken}");
    assert!(broken["stderr"].as_str().unwrap().contains("error"), "{broken}");
    let files = json!([{"path": "in.txt", "content": "from a file"}]);
    let cmd = post_run(json!({"cmd": "cat in.txt; exit 7", "files": files}));
    assert_eq!((cmd["stdout"].clone(), cmd["exit_code"].clone()), (json!("from a file"), json!(7)), "{cmd}");

    let ids: Vec<String> =
        [&python, &broken, &cmd].iter().map(|r| r["sandbox_id"].as_str().unwrap().to_owned()).collect();
    let all = http()
        .get(format!("{}/v1/sandboxes?state=all", server.url))
        .header("Authorization", format!("Bearer {KEY_1}"))
        .call()
        .unwrap()
        .body_mut()
        .read_json::<Value>()
        .unwrap();
    for sandbox in all["sandboxes"].as_array().unwrap() {
        assert_eq!(sandbox["state"], "destroyed", "a run's sandbox is gone when it answers: {sandbox}");
    }
    for id in &ids {
        common::assert_gone(tier, id);
    }
    assert_eq!(server.stop(), Some(0));
    drop(lock);
    assert_nothing_left(tier, &ids);
}
