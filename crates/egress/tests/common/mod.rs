//! Shared test harness: an in-memory audit sink, small upstream servers on 127.0.0.1, a proxy served on a
//! 127.0.0.1 listener, and a raw HTTP/1.1 client. Loopback only.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use sandkasten_egress::{AuditEvent, AuditSink, EgressConfig, Policy, Proxy, ProxyHandle, SandboxCa, SandboxEgress};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// Collects audit events: the final record of each attempt in `events`, the records of connections opening in
/// `opened`.
#[derive(Default)]
pub struct MemAudit {
    pub events: Mutex<Vec<AuditEvent>>,
    pub opened: Mutex<Vec<AuditEvent>>,
}

impl AuditSink for MemAudit {
    fn record(&self, event: AuditEvent) {
        if event.open {
            self.opened.lock().unwrap().push(event);
        } else {
            self.events.lock().unwrap().push(event);
        }
    }
}

impl MemAudit {
    /// Waits (bounded) until at least `n` events are recorded and returns them.
    pub async fn wait_for(&self, n: usize) -> Vec<AuditEvent> {
        for _ in 0..200 {
            {
                let events = self.events.lock().unwrap();
                if events.len() >= n {
                    return events.clone();
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let events = self.events.lock().unwrap().clone();
        panic!("expected {n} audit events, got {}: {events:#?}", events.len());
    }
}

/// A running proxy for one sandbox.
pub struct TestProxy {
    pub addr: SocketAddr,
    pub handle: Option<ProxyHandle>,
    pub audit: Arc<MemAudit>,
    pub sandbox: Arc<SandboxEgress>,
}

/// `allowed.test`, `other.test` → 127.0.0.1 and `127.0.0.1/32` allowed, plus `extra` entries.
pub fn loopback_config(extra: &[(&str, &str)]) -> EgressConfig {
    let mut cfg = EgressConfig { allow_cidrs: vec!["127.0.0.1/32".into()], ..Default::default() };
    cfg.hosts.insert("allowed.test".into(), vec!["127.0.0.1".parse().unwrap()]);
    cfg.hosts.insert("other.test".into(), vec!["127.0.0.1".parse().unwrap()]);
    for (name, ip) in extra {
        cfg.hosts.insert((*name).into(), vec![ip.parse().unwrap()]);
    }
    cfg
}

pub async fn start_proxy(config: EgressConfig, policy: Policy, ca: Option<SandboxCa>) -> TestProxy {
    let audit = Arc::new(MemAudit::default());
    let proxy = Proxy::new(config, audit.clone()).unwrap();
    let sandbox = Arc::new(SandboxEgress::new("sb-test", "tenant-a", policy, ca));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = proxy.serve(listener, sandbox.clone());
    TestProxy { addr, handle: Some(handle), audit, sandbox }
}

pub fn allowlist(allow: &[&str]) -> Policy {
    let allow: Vec<String> = allow.iter().map(|s| (*s).to_owned()).collect();
    Policy::compile(sandkasten_egress::Mode::Allowlist, &allow, &[]).unwrap()
}

/// What an upstream server received: request heads and bodies, in order.
pub type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A one-request-per-connection HTTP server answering `200 hello` and recording each request.
pub async fn http_upstream() -> (SocketAddr, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received: Received = Arc::default();
    let rec = received.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let rec = rec.clone();
            tokio::spawn(async move { serve_one(stream, rec).await });
        }
    });
    (addr, received)
}

/// Serves one request on any stream: records it, answers `200 hello`, closes.
pub async fn serve_one<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, rec: Received) {
    let Some((head, body)) = read_message(&mut stream).await else { return };
    rec.lock().unwrap().push((head, body));
    let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello").await;
    let _ = stream.shutdown().await;
}

/// What a recording upstream received: per connection, its bytes and whether the client has closed it.
pub type Recorded = Arc<Mutex<Vec<(Vec<u8>, bool)>>>;

/// A TCP server that says nothing and records every byte of every connection until the client closes it.
pub async fn recording_upstream() -> (SocketAddr, Recorded) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    (listener.local_addr().unwrap(), record_on(listener))
}

/// Records on `listener` as `recording_upstream` does.
pub fn record_on(listener: TcpListener) -> Recorded {
    let recorded: Recorded = Arc::default();
    let rec = recorded.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let index = {
                let mut rec = rec.lock().unwrap();
                rec.push((Vec::new(), false));
                rec.len() - 1
            };
            let rec = rec.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                loop {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => rec.lock().unwrap()[index].0.extend_from_slice(&buf[..n]),
                    }
                }
                rec.lock().unwrap()[index].1 = true;
            });
        }
    });
    recorded
}

/// Waits (bounded) until every connection `recorded` has seen was closed by the client; returns them.
pub async fn closed_connections(recorded: &Recorded) -> Vec<Vec<u8>> {
    for _ in 0..500 {
        {
            let rec = recorded.lock().unwrap();
            if !rec.is_empty() && rec.iter().all(|(_, closed)| *closed) {
                return rec.iter().map(|(bytes, _)| bytes.clone()).collect();
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the upstream's connections were not all closed: {:?}", recorded.lock().unwrap());
}

/// A TCP echo server.
pub async fn echo_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// Reads one HTTP message (head + Content-Length body).
pub async fn read_message<S: AsyncRead + Unpin>(stream: &mut S) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut byte)).await.ok()?.ok()?;
        if n == 0 {
            return None;
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let len = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>()))
        .and_then(Result::ok)
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut body)).await.ok()?.ok()?;
    Some((head, body))
}

/// Sends `request` and reads one response: (status, head, body).
pub async fn roundtrip<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, request: &str) -> (u16, String, String) {
    stream.write_all(request.as_bytes()).await.unwrap();
    let (head, body) = read_message(stream).await.expect("a response");
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status code");
    (status, head, String::from_utf8_lossy(&body).into_owned())
}

/// A new client connection to the proxy.
pub async fn client(proxy: &TestProxy) -> TcpStream {
    TcpStream::connect(proxy.addr).await.unwrap()
}

/// Whether `listener` gets a connection within a short time (used to prove no connect attempt was made).
pub async fn got_connection(listener: &TcpListener) -> bool {
    tokio::time::timeout(Duration::from_millis(200), listener.accept()).await.is_ok()
}

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A test CA for the upstream side, its PEM file, and a TLS upstream server for `allowed.test` and
/// `other.test` that records requests.
pub struct TlsUpstream {
    pub addr: std::net::SocketAddr,
    pub received: Received,
    pub ca_pem: String,
    pub _dir: tempfile::TempDir,
    pub ca_file: std::path::PathBuf,
}

pub async fn tls_upstream() -> TlsUpstream {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["allowed.test".to_owned(), "other.test".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key)
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received: Received = Arc::default();
    let rec = received.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (acceptor, rec) = (acceptor.clone(), rec.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(stream).await {
                    serve_one(tls, rec).await;
                }
            });
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("upstream-ca.pem");
    std::fs::write(&ca_file, ca_cert.pem()).unwrap();
    TlsUpstream { addr, received, ca_pem: ca_cert.pem(), _dir: dir, ca_file }
}

pub fn client_config(ca_pem: &str) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    use rustls::pki_types::pem::PemObject;
    roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap()).unwrap();
    Arc::new(
        ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// Opens a CONNECT tunnel to `host:port` through the proxy.
pub async fn tunnel(proxy: &TestProxy, host: &str, port: u16) -> TcpStream {
    let mut c = client(proxy).await;
    let (status, head, _) = roundtrip(&mut c, &format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}\r\n\r\n")).await;
    assert_eq!(status, 200, "{head}");
    c
}
