//! A `moto_server` (moto's S3-compatible server, from `scripts/setup-s3-test-server.sh`) started on loopback for a
//! test, with the port it chose; dropping it kills and reaps it. Shared by this crate's S3 test and the server's
//! snapshot suite (`crates/cli/tests/serve_snapshots.rs` includes this file by path).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long the server may take to say which port it listens on.
const START_LIMIT: Duration = Duration::from_secs(30);

/// A `moto_server` process of this test; dropping it kills and reaps it.
pub struct MotoServer {
    pub child: Child,
    pub port: u16,
}

impl MotoServer {
    pub fn binary() -> PathBuf {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).expect("the crate is two folders down");
        repo.join("target/s3-test-venv/bin/moto_server")
    }

    /// Starts the server on 127.0.0.1, or says why it cannot (not installed).
    pub fn start() -> Result<MotoServer, String> {
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

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Creates a bucket (object_store has no call for it; moto takes an unsigned request).
    pub fn create_bucket(&self, bucket: &str) {
        let response = self.request("PUT", &format!("/{bucket}"), b"");
        assert!(response.starts_with("HTTP/1.1 200"), "creating bucket {bucket}: {response}");
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl MotoServer {
    /// One unsigned request (moto takes them) and its whole response: status line, headers and body.
    pub fn request(&self, method: &str, path: &str, body: &[u8]) -> String {
        let mut connection = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.port,
            body.len()
        );
        connection.write_all(head.as_bytes()).unwrap();
        connection.write_all(body).unwrap();
        let mut response = Vec::new();
        connection.read_to_end(&mut response).unwrap();
        String::from_utf8_lossy(&response).into_owned()
    }

    /// The keys under `prefix` in `bucket` (one listing page: enough for tests).
    pub fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let listing = self.request("GET", &format!("/{bucket}?list-type=2&prefix={prefix}"), b"");
        listing.split("<Key>").skip(1).filter_map(|rest| rest.split("</Key>").next()).map(str::to_owned).collect()
    }
}
