//! The HTTP server cannot be held open by clients that never finish a request: against a real `sandkasten serve`,
//! hundreds of half-open connections (a partial request head, then silence) from one address get that address's
//! share and no more (the rest are closed at once), `/healthz` still answers another client meanwhile, the server's
//! descriptors stay bounded, and the held connections are closed at the header-read timeout, after which the first
//! client is served again. A start whose descriptor limit cannot hold its connection caps is refused.

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::FromRawFd;
use std::time::{Duration, Instant};

use serve::Server;

const PER_CLIENT: usize = 64;
const HALF_OPEN: usize = 400;
/// The header-read timeout of the test's server: long enough that opening and sorting `HALF_OPEN` connections ends
/// well before it, even on a loaded machine (the suite runs microVMs under software emulation beside this test).
const HEADER_TIMEOUT: Duration = Duration::from_secs(8);
/// `max_connections` of the many-clients test (its 12 clients hold 768 half-open connections).
const MANY_MAX: usize = 256;

fn port_of(server: &Server) -> u16 {
    server.url.rsplit(':').next().unwrap().parse().unwrap()
}

/// A connection to the server from `source` (a loopback address other than 127.0.0.1 is another client).
fn connect_from(source: [u8; 4], port: u16) -> TcpStream {
    // SAFETY: a fresh socket, bound and connected with sockaddr_in values built here, then owned by the TcpStream.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let addr = |ip: [u8; 4], port: u16| libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(ip) },
            sin_zero: [0; 8],
        };
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let local = addr(source, 0);
        assert_eq!(libc::bind(fd, (&raw const local).cast(), len), 0, "bind {source:?}");
        let remote = addr([127, 0, 0, 1], port);
        assert_eq!(libc::connect(fd, (&raw const remote).cast(), len), 0, "connect");
        TcpStream::from_raw_fd(fd)
    }
}

/// `GET /healthz` from `source`: the status line.
fn healthz_from(source: [u8; 4], port: u16) -> String {
    let mut stream = connect_from(source, port);
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.lines().next().unwrap_or_default().to_owned()
}

/// True when the server closed `stream` (end of file or reset) within `wait`.
fn closed_by_server(stream: &mut TcpStream, wait: Duration) -> bool {
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
    }
}

fn descriptors_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn half_open_connections_get_one_clients_share_and_are_closed_at_the_header_timeout() {
    require_root!();
    let server = Server::start_with(&format!(
        "[http]\nheader_read_timeout_ms = {}\nmax_connections_per_client = {PER_CLIENT}\n",
        HEADER_TIMEOUT.as_millis()
    ));
    let port = port_of(&server);
    let before = descriptors_of(server.pid());
    let opened = Instant::now();
    let mut held: Vec<TcpStream> = (0..HALF_OPEN)
        .map(|_| {
            let mut stream = connect_from([127, 0, 0, 1], port);
            stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").unwrap();
            stream
        })
        .collect();
    // Past its share, a client's connections are closed at once; its share stays open (for now).
    std::thread::sleep(Duration::from_millis(100));
    let mut open: Vec<TcpStream> =
        held.drain(..).filter_map(|mut s| (!closed_by_server(&mut s, Duration::from_millis(5))).then_some(s)).collect();
    let told = opened.elapsed();
    assert!(told < HEADER_TIMEOUT - Duration::from_millis(500), "the check took too long to tell: {told:?}");
    assert!(
        (PER_CLIENT - 4..=PER_CLIENT).contains(&open.len()),
        "{} of {HALF_OPEN} half-open connections from one client are open; its share is {PER_CLIENT}",
        open.len()
    );
    // Another client is served meanwhile, and the server holds about one client's share of descriptors.
    assert_eq!(healthz_from([127, 0, 0, 2], port), "HTTP/1.1 200 OK");
    let during = descriptors_of(server.pid());
    assert!(during <= before + PER_CLIENT + 16, "the server holds {during} descriptors (before: {before})");
    // The share is closed at the header-read timeout, not before.
    for stream in &mut open {
        let wait = HEADER_TIMEOUT + Duration::from_secs(2);
        assert!(closed_by_server(stream, wait), "a half-open connection outlived the timeout");
        let closed = opened.elapsed();
        assert!(closed >= HEADER_TIMEOUT - Duration::from_millis(100), "closed before the timeout: {closed:?}");
    }
    // Its slots are back: the first client is served again.
    assert_eq!(healthz_from([127, 0, 0, 1], port), "HTTP/1.1 200 OK");
}

/// Half-open connections spread over many client addresses (each within its share) fill every one of
/// `max_connections`: the server then closes the connection idle longest (no request in flight, none streaming) to
/// take a new one, so `/healthz` still answers at once, and a client in the middle of a streamed answer keeps it.
#[test]
fn half_open_connections_from_many_clients_cannot_keep_healthz_from_answering() {
    require_root!();
    const CLIENTS: u8 = 12;
    let server = Server::start_with(&format!(
        "[http]\nheader_read_timeout_ms = 20000\nmax_connections = {MANY_MAX}\nmax_connections_per_client = {PER_CLIENT}\n"
    ));
    let port = port_of(&server);
    let before = descriptors_of(server.pid());
    // A long streamed answer in flight from its own client (the command prints for 8 s).
    let id = server.create(serde_json::json!({}));
    let mut streaming = connect_from([127, 0, 1, 1], port);
    let body = r#"{"cmd": "for i in $(seq 40); do echo tick; sleep 0.2; done"}"#;
    write!(
        streaming,
        "POST /v1/sandboxes/{id}/exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nAccept: text/event-stream\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        serve::KEY_1,
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 256];
    streaming.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let got = streaming.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..got]).starts_with("HTTP/1.1 200"), "the stream did not start");
    let mut held = Vec::new();
    for client in 0..CLIENTS {
        for _ in 0..PER_CLIENT {
            let mut stream = connect_from([127, 0, 2, client + 1], port);
            stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").unwrap();
            held.push(stream);
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    for attempt in 0..5 {
        let asked = Instant::now();
        assert_eq!(healthz_from([127, 0, 3, attempt + 1], port), "HTTP/1.1 200 OK", "attempt {attempt}");
        assert!(asked.elapsed() < Duration::from_secs(2), "/healthz took {:?}", asked.elapsed());
    }
    let during = descriptors_of(server.pid());
    assert!(during <= before + MANY_MAX + 32, "the server holds {during} descriptors (before: {before})");
    // The streamed answer was not the one closed: it goes on to its end.
    let mut rest = Vec::new();
    let _ = streaming.read_to_end(&mut rest);
    let text = String::from_utf8_lossy(&rest);
    eprintln!("the stream went on: {} ticks after the first read", text.matches("tick").count());
    assert!(text.matches("tick").count() >= 30, "the stream was cut: {text}");
    drop(held);
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), serve::KEY_1, None).status, 204);
}

/// The caps are sized against the server's descriptors at start: a `RLIMIT_NOFILE` (hard, so it cannot be raised)
/// too small for `[http] max_connections` plus two descriptors per `[egress] max_total_connections` (defaults: 4096
/// and 4096), or for the sandboxes the tenants may run besides, makes `serve` refuse to start, naming them and the
/// limit, instead of running out under load.
#[test]
fn a_start_without_descriptors_for_its_connection_caps_is_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "ulimit -n 2000 && exec {} serve --insecure-no-auth --listen 127.0.0.1:0 --database {}",
        common::bin(),
        dir.path().join("sandkasten.db").display()
    );
    let started = Instant::now();
    let output = std::process::Command::new("sh")
        .args(["-c", &script])
        .env_remove("SANDKASTEN_API_KEYS")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "serve started with 2000 descriptors for 4096 + 2 × 4096 connections: {stderr}");
    for needle in ["http.max_connections: 4096", "max_total_connections = 4096", "RLIMIT_NOFILE allows 2000"] {
        assert!(stderr.contains(needle), "the refusal does not say {needle:?}: {stderr}");
    }
    assert!(started.elapsed() < Duration::from_secs(20), "serve took {:?} to refuse", started.elapsed());
    // The sandboxes the tenants may run count too (a few descriptors each): 16 384 would do for the connections alone.
    let config = dir.path().join("sandkasten.toml");
    std::fs::write(
        &config,
        "[[tenants]]\nname = \"big\"\napi_keys = [\"big-key-0123456789abcdefghij\"]\nmax_sandboxes = 1000\n",
    )
    .unwrap();
    let script = format!(
        "ulimit -n 18000 && exec {} serve --listen 127.0.0.1:0 --config {} --database {}",
        common::bin(),
        config.display(),
        dir.path().join("sandkasten.db").display()
    );
    let output = std::process::Command::new("sh")
        .args(["-c", &script])
        .env_remove("SANDKASTEN_API_KEYS")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "serve started with 18000 descriptors for 1000 sandboxes too: {stderr}");
    assert!(stderr.contains("1000 sandboxes") && stderr.contains("RLIMIT_NOFILE allows 18000"), "{stderr}");
}
