//! The store's behaviour (`cases`) through `s3://` against a real S3-compatible server: moto's `moto_server`,
//! started by this test on loopback (a port of its own choosing), with one bucket and a prefix per case, and killed
//! at the end.
//!
//! The server comes from `scripts/setup-s3-test-server.sh` (run by `scripts/setup.sh`, so by CI). Where it is not
//! installed the test says so and skips — except under CI (`CI` set), where a missing server fails the test, so a
//! broken install cannot pass as a green run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cases;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use cases::Harness;
use object_store::aws::AmazonS3Builder;
use object_store::prefix::PrefixStore;
use sandkasten_snapshot_store::{S3Options, SnapshotStore, StoreConfig};

const BUCKET: &str = "sandkasten-snapshots";

/// How long the server may take to say which port it listens on.
const START_LIMIT: Duration = Duration::from_secs(30);

/// A `moto_server` process of this test; dropping it kills and reaps it.
struct MotoServer {
    child: Child,
    port: u16,
}

impl MotoServer {
    fn binary() -> PathBuf {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).expect("the crate is two folders down");
        repo.join("target/s3-test-venv/bin/moto_server")
    }

    /// Starts the server on 127.0.0.1, or says why it cannot (not installed).
    fn start() -> Result<MotoServer, String> {
        let binary = Self::binary();
        if !binary.exists() {
            return Err(format!(
                "{} is missing: run scripts/setup-s3-test-server.sh (scripts/setup.sh and CI run it)",
                binary.display()
            ));
        }
        let mut child = Command::new(&binary)
            .args(["-H", "127.0.0.1", "-p", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {}: {error}", binary.display()));
        // The server logs every request on stderr: read it to the end, or it blocks once the pipe is full.
        let stderr = child.stderr.take().unwrap();
        let (port_found, port) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(port) = line.split("Running on http://127.0.0.1:").nth(1) {
                    let _ = port_found.send(port.trim().parse::<u16>().ok());
                }
            }
        });
        let mut server = MotoServer { child, port: 0 };
        match port.recv_timeout(START_LIMIT) {
            Ok(Some(port)) => server.port = port,
            other => panic!("moto_server did not report its port within {START_LIMIT:?}: {other:?}"),
        }
        Ok(server)
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Creates a bucket (object_store has no call for it; moto takes an unsigned request).
    fn create_bucket(&self, bucket: &str) {
        let mut connection = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        let request = format!(
            "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        );
        connection.write_all(request.as_bytes()).unwrap();
        let mut response = String::new();
        connection.read_to_string(&mut response).unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "creating bucket {bucket}: {response}");
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Store settings for the moto server: path-style requests to the loopback endpoint, throwaway keys.
fn s3_options(server: &MotoServer) -> S3Options {
    S3Options {
        endpoint: Some(server.endpoint()),
        region: Some("us-east-1".to_owned()),
        access_key_id: Some("testing".to_owned()),
        secret_access_key: Some("testing".to_owned()),
        allow_http: true,
    }
}

/// A harness for one case: its own prefix in the bucket.
fn harness(server: &MotoServer, case: &str) -> Harness {
    let options = s3_options(server);
    let config = StoreConfig { url: format!("s3://{BUCKET}/{case}"), s3: options.clone(), gc_grace: Duration::ZERO };
    // Opening installs the TLS crypto provider the raw client below needs too.
    SnapshotStore::open(&config).unwrap();
    let raw = AmazonS3Builder::new()
        .with_bucket_name(BUCKET)
        .with_endpoint(server.endpoint())
        .with_region("us-east-1")
        .with_access_key_id("testing")
        .with_secret_access_key("testing")
        .with_allow_http(true)
        .build()
        .unwrap();
    Harness { config, raw: Arc::new(PrefixStore::new(raw, case)) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_s3_store_passes_every_case_against_a_real_server() {
    let server = match MotoServer::start() {
        Ok(server) => server,
        Err(reason) if std::env::var_os("CI").is_some() => panic!("{reason}"),
        Err(reason) => {
            println!("skipped: {reason}");
            return;
        }
    };
    server.create_bucket(BUCKET);
    for (name, case) in cases::ALL {
        println!("case {name}");
        case(&harness(&server, name)).await;
    }

    let pid = server.child.id();
    drop(server);
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "moto_server {pid} is still there after the test");
}
