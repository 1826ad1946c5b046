//! A real `sandkasten serve` for end-to-end tests: started on a free loopback port with its own database and keys,
//! stopped with SIGTERM when dropped; plus a small JSON-over-HTTP helper (ureq) that never turns statuses into errors.

#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Tenant `t1`'s key.
pub const KEY_1: &str = "t1-key-0123456789abcdefghij";
/// Tenant `t2`'s key.
pub const KEY_2: &str = "t2-key-0123456789abcdefghij";

/// A running server.
pub struct Server {
    child: Option<Child>,
    /// Base URL, e.g. `http://127.0.0.1:40123`.
    pub url: String,
    /// Directory holding the database and config (kept across restarts).
    pub dir: tempfile::TempDir,
    http: ureq::Agent,
    /// The suite lock held for the server's life: shared normally, exclusive for tests that must be alone (a server's
    /// spawner garbage-collects other runs' leftovers when it starts).
    _lock: crate::common::SuiteLock,
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

/// A response: status and JSON body (`Value::Null` when the body is not JSON).
#[derive(Debug)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Parsed body.
    pub json: Value,
    /// Raw body.
    pub body: Vec<u8>,
}

impl Server {
    /// Starts a server with tenants t1 (64 sandboxes, 32 GiB) and t2 (8 sandboxes, 4 GiB).
    pub fn start() -> Server {
        Server::start_with("")
    }

    /// As `start`, holding the suite lock exclusively until the server is dropped.
    pub fn start_exclusive() -> Server {
        Server::start_locked("", "", crate::common::exclusive_lock())
    }

    /// As `start_with`, holding the suite lock exclusively until the server is dropped.
    pub fn start_exclusive_with(extra: &str) -> Server {
        Server::start_locked("", extra, crate::common::exclusive_lock())
    }

    /// As `start`, with `extra` appended to the config file (e.g. `[[pools]]` tables).
    pub fn start_with(extra: &str) -> Server {
        Server::start_locked("", extra, crate::common::shared_lock())
    }

    /// `top` goes at the top of the config file (top-level settings), `extra` at its end (tables).
    fn start_locked(top: &str, extra: &str, lock: crate::common::SuiteLock) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = format!(
            "{top}\n[[tenants]]\nname = \"t1\"\napi_keys = [\"{KEY_1}\"]\nmax_sandboxes = 64\nmax_pids = 1048576\nmax_memory_bytes = {}\n\n\
             [[tenants]]\nname = \"t2\"\napi_keys = [\"{KEY_2}\"]\nmax_sandboxes = 8\nmax_memory_bytes = {}\n\n{extra}\n",
            32u64 << 30,
            4u64 << 30
        );
        std::fs::File::create(dir.path().join("sandkasten.toml"))
            .and_then(|mut f| f.write_all(config.as_bytes()))
            .expect("write config");
        let http: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        let mut server = Server { child: None, url: String::new(), dir, http, _lock: lock };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let port = free_port();
        self.url = format!("http://127.0.0.1:{port}");
        let child = Command::new(crate::common::bin())
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--config")
            .arg(self.dir.path().join("sandkasten.toml"))
            .arg("--database")
            .arg(self.database())
            .env_remove("SANDKASTEN_API_KEYS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start sandkasten serve");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(reply) = self.http.get(format!("{}/healthz", self.url)).call()
                && reply.status() == 200
            {
                return;
            }
            assert!(Instant::now() < deadline, "the server did not become healthy at {}", self.url);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The database file.
    pub fn database(&self) -> PathBuf {
        self.dir.path().join("sandkasten.db")
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// Kills the server with `signal` and waits for it.
    pub fn stop_with(&mut self, signal: i32) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on our own, not yet reaped child.
            unsafe { libc::kill(child.id() as libc::pid_t, signal) };
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                if child.try_wait().ok().flatten().is_some() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("the server did not stop within 15 s of signal {signal}");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Starts the server again on the same database.
    pub fn restart(&mut self) {
        self.stop_with(libc::SIGTERM);
        self.launch();
    }

    /// Starts a stopped server again on the same database.
    pub fn relaunch(&mut self) {
        assert!(self.child.is_none(), "relaunch needs a stopped server");
        self.launch();
    }

    fn reply(result: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Reply {
        let mut response = result.expect("HTTP request failed");
        let status = response.status().as_u16();
        let body = response.body_mut().read_to_vec().unwrap_or_default();
        let json = serde_json::from_slice(&body).unwrap_or(Value::Null);
        Reply { status, json, body }
    }

    /// A JSON request as tenant `key`.
    pub fn call(&self, method: &str, path: &str, key: &str, body: Option<Value>) -> Reply {
        let url = format!("{}{path}", self.url);
        let auth = format!("Bearer {key}");
        let result = match (method, body) {
            ("GET", _) => self.http.get(&url).header("Authorization", &auth).call(),
            ("DELETE", _) => self.http.delete(&url).header("Authorization", &auth).call(),
            ("POST", Some(body)) => self.http.post(&url).header("Authorization", &auth).send_json(body),
            ("POST", None) => self.http.post(&url).header("Authorization", &auth).send_empty(),
            ("PUT", Some(body)) => self.http.put(&url).header("Authorization", &auth).send_json(body),
            (other, _) => panic!("unsupported method {other}"),
        };
        Self::reply(result)
    }

    /// PUT raw bytes.
    pub fn put_bytes(&self, path: &str, key: &str, bytes: &[u8]) -> Reply {
        let url = format!("{}{path}", self.url);
        Self::reply(self.http.put(&url).header("Authorization", format!("Bearer {key}")).send(bytes))
    }

    /// Creates a sandbox as t1 and returns its id.
    pub fn create(&self, body: Value) -> String {
        let reply = self.call("POST", "/v1/sandboxes", KEY_1, Some(body));
        assert_eq!(reply.status, 201, "create failed: {reply:?}");
        reply.json["id"].as_str().expect("id").to_owned()
    }

    /// Runs a shell command in sandbox `id` as t1.
    pub fn exec(&self, id: &str, cmd: &str) -> Reply {
        self.call("POST", &format!("/v1/sandboxes/{id}/exec"), KEY_1, Some(serde_json::json!({ "cmd": cmd })))
    }

    /// A raw agent for streaming requests.
    pub fn http(&self) -> &ureq::Agent {
        &self.http
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.stop_with(libc::SIGTERM);
        }
    }
}

/// Host pids running as a sandbox uid (the range starts at 1 000 000 000).
pub fn sandbox_processes() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| crate::common::process_uid(*pid).is_some_and(|uid| uid >= crate::common::SANDBOX_UID_BASE))
        .collect()
}

/// Waits (up to 10 s) until no process of sandbox `id` and none of its host state remain.
pub fn assert_sandbox_gone(id: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = crate::common::leftovers(id);
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "sandbox {id} left: {left:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// Per-tier suites
// ---------------------------------------------------------------------------------------------------------------------

use crate::common::Tier;

impl Server {
    /// As `start`, with `[defaults] isolation = "<tier>"`: every sandbox this server creates without naming a tier
    /// (the CLI's `sandbox create`, the E2B facade's, `/v1/run`'s) is of `tier` too.
    pub fn start_on(tier: Tier) -> Server {
        Server::start_with_on(tier, "")
    }

    /// As `start_exclusive`, with `[defaults] isolation = "<tier>"` (see `start_on`).
    pub fn start_exclusive_on(tier: Tier) -> Server {
        Server::start_locked("", &tier_defaults(tier, ""), crate::common::exclusive_lock())
    }

    /// As `start_with`, with `[defaults] isolation = "<tier>"` (see `start_on`).
    pub fn start_with_on(tier: Tier, extra: &str) -> Server {
        Server::start_locked("", &tier_defaults(tier, extra), crate::common::shared_lock())
    }

    /// As `start_on`, with `settings` (top-level keys such as `max_retained_output_bytes = 4194304`) in the config.
    pub fn start_with_settings_on(tier: Tier, settings: &str) -> Server {
        Server::start_locked(settings, &tier_defaults(tier, ""), crate::common::shared_lock())
    }

    /// Creates a sandbox of `tier` as t1 (`"isolation"` set in `body`) and returns its id; asserts the server
    /// reports that tier.
    pub fn create_on(&self, tier: Tier, body: Value) -> String {
        let mut body = body;
        body["isolation"] = Value::from(tier.name());
        let reply = self.call("POST", "/v1/sandboxes", KEY_1, Some(body));
        assert_eq!(reply.status, 201, "create on {tier} failed: {reply:?}");
        assert_eq!(reply.json["isolation"]["tier"], tier.name(), "the sandbox is not of the tier asked for: {reply:?}");
        reply.json["id"].as_str().expect("id").to_owned()
    }
}

/// `extra` config with a `[defaults]` table making `tier` the tier of creates that name none.
pub fn tier_defaults(tier: Tier, extra: &str) -> String {
    format!("[defaults]\nisolation = \"{tier}\"\n\n{extra}")
}

/// Waits (up to 10 s) until nothing of sandbox `id` of `tier` remains on the host (for gVisor also its bundle,
/// runsc state, runsc/Sentry/gofer processes and mounts).
pub fn assert_sandbox_gone_on(tier: Tier, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = crate::common::leftovers_on(tier, id);
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "sandbox {id} ({tier}) left: {left:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A metric's value from the server's `/metrics` (0 when absent).
pub fn metric(server: &Server, name: &str) -> f64 {
    let mut reply = server.http().get(format!("{}/metrics", server.url)).call().expect("GET /metrics");
    let text = reply.body_mut().read_to_string().unwrap_or_default();
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Direct children of `pid` (a server's: its spawner; a spawner's: its sandboxes' agents).
pub fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Waits (up to 10 s) until `pid` is gone or a zombie.
pub fn wait_until_dead(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z")
    {
        assert!(Instant::now() < deadline, "process {pid} did not die");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The server's one spawner.
pub fn spawner_of(server: &Server) -> u32 {
    let spawners = children_of(server.pid());
    assert_eq!(spawners.len(), 1, "the server runs exactly one spawner: {spawners:?}");
    spawners[0]
}
