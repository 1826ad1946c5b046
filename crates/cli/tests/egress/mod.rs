//! The egress tests' world: test hosts in network namespaces of their own (a web server at `allowed.test`, another
//! at `other.test`, an HTTPS one at `secure.test`, a fake cloud metadata server at 169.254.169.254), the server
//! config that names them, and a lock so that only one test process at a time uses these fixed addresses.

#![allow(dead_code)]

pub mod testnet;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::serve::{KEY_1, Server};
use testnet::TestHost;

/// Port of every plain HTTP test host.
pub const HTTP_PORT: u16 = 80;

/// The `[egress]` table naming the test hosts: `allowed.test` and `other.test` in an allowed private range,
/// `metadata.test` at the metadata address and `private.test` in a private range nobody allowed.
pub const EGRESS_CONFIG: &str = r#"
[egress]
allow_cidrs = ["10.201.0.0/24"]
upstream_ca_file = "UPSTREAM_CA"

[egress.hosts]
"allowed.test" = ["10.201.0.2"]
"other.test" = ["10.201.0.6"]
"secure.test" = ["10.201.0.10"]
"metadata.test" = ["169.254.169.254"]
"private.test" = ["10.202.0.2"]
"#;

/// Holds the egress tests' lock (an exclusive flock), so tests using the fixed addresses run one at a time.
pub struct NetLock(File);

impl NetLock {
    fn take() -> NetLock {
        let file = File::create("/tmp/sandkasten-egress-tests.lock").expect("lock file");
        // SAFETY: flock on a descriptor we own; blocks until no other test process holds it.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(rc, 0, "flock");
        NetLock(file)
    }
}

/// The test hosts, a CA for the HTTPS one, and a server configured for them.
pub struct World {
    /// The server (first field: dropped, with its sandboxes, before the hosts).
    pub server: Server,
    /// `allowed.test`.
    pub allowed: TestHost,
    /// `other.test`.
    pub other: TestHost,
    /// `secure.test` (HTTPS on 443, certificate from `ca`).
    pub secure: TestHost,
    /// 169.254.169.254.
    pub metadata: TestHost,
    ca_dir: tempfile::TempDir,
    _lock: NetLock,
}

fn openssl(args: &[&str], dir: &std::path::Path) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("run openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A test CA and a certificate for `secure.test` signed by it; returns the directory holding ca.pem, cert.pem and
/// key.pem.
fn make_certificates() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path();
    openssl(
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=sandkasten test CA",
        ],
        path,
    );
    openssl(
        &["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out", "cert.csr", "-subj", "/CN=secure.test"],
        path,
    );
    std::fs::write(path.join("ext.cnf"), "subjectAltName=DNS:secure.test\n").expect("ext");
    openssl(
        &[
            "x509",
            "-req",
            "-in",
            "cert.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "cert.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
        path,
    );
    dir
}

impl World {
    /// Builds the world; `extra` is appended to the server's config.
    pub fn start(extra: &str) -> World {
        let lock = NetLock::take();
        let allowed = TestHost::start("allowed.test", "10.201.0.1", "10.201.0.2", HTTP_PORT);
        let other = TestHost::start("other.test", "10.201.0.5", "10.201.0.6", HTTP_PORT);
        let ca_dir = make_certificates();
        let (cert, key) = (ca_dir.path().join("cert.pem"), ca_dir.path().join("key.pem"));
        let secure = TestHost::start_with_tls("secure.test", "10.201.0.9", "10.201.0.10", 443, Some((&cert, &key)));
        let metadata = TestHost::start("metadata", "169.254.169.253", "169.254.169.254", HTTP_PORT);
        std::fs::write(metadata.dir().join("latest"), "ami-id\ninstance-id\n").expect("metadata file");
        let ca = ca_dir.path().join("ca.pem");
        let config = EGRESS_CONFIG.replace("UPSTREAM_CA", ca.to_str().expect("utf-8 path"));
        let server = Server::start_with(&format!("{config}\n{extra}"));
        World { server, allowed, other, secure, metadata, ca_dir, _lock: lock }
    }

    /// Creates a sandbox as t1 with `network` (and other create fields in `extra`).
    pub fn sandbox(&self, network: Value) -> String {
        self.server.create(json!({ "network": network }))
    }

    /// Runs `cmd` in sandbox `id` for up to its command limit; returns (exit code, stdout, stderr).
    pub fn sh(&self, id: &str, cmd: &str) -> (i64, String, String) {
        let reply = self.server.call("POST", &format!("/v1/sandboxes/{id}/exec"), KEY_1, Some(json!({ "cmd": cmd })));
        assert_eq!(reply.status, 200, "exec failed: {reply:?}");
        let text = |key: &str| reply.json[key].as_str().unwrap_or_default().to_owned();
        (reply.json["exit_code"].as_i64().unwrap_or(-1), text("stdout"), text("stderr"))
    }

    /// The sandbox's audit events, waiting (up to 5 s) until at least `at_least` are recorded.
    pub fn audit(&self, id: &str, at_least: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let reply = self.server.call("GET", &format!("/v1/sandboxes/{id}/egress"), KEY_1, None);
            assert_eq!(reply.status, 200, "{reply:?}");
            let events = reply.json["events"].as_array().cloned().unwrap_or_default();
            if events.len() >= at_least || Instant::now() > deadline {
                return events;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The server's Prometheus text.
    pub fn metrics(&self) -> String {
        let mut response = self.server.http().get(format!("{}/metrics", self.server.url)).call().expect("metrics");
        response.body_mut().read_to_string().expect("metrics text")
    }

    /// The test CA's certificate file.
    pub fn test_ca(&self) -> PathBuf {
        self.ca_dir.path().join("ca.pem")
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// Per-tier suites
// ---------------------------------------------------------------------------------------------------------------------

use crate::common::Tier;

impl World {
    /// As `start`, with `[defaults] isolation = "<tier>"` in the server's config (see `Server::start_on`).
    pub fn start_on(tier: Tier, extra: &str) -> World {
        World::start(&crate::serve::tier_defaults(tier, extra))
    }

    /// Creates a sandbox of `tier` as t1 with `network`.
    pub fn sandbox_on(&self, tier: Tier, network: Value) -> String {
        self.server.create_on(tier, json!({ "network": network }))
    }
}
