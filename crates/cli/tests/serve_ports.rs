//! Ports of a sandbox against a real `sandkasten serve` (#14, item 4): a server started inside the sandbox (as a
//! background command) is reached through `/v1/sandboxes/{id}/ports/{port}/{path}` (the owner's API key) and through
//! its E2B host name `PORT-SANDBOXID.DOMAIN` (the traffic access token, unless created with `allowPublicTraffic`):
//! `python3 -m http.server` serves a file; an echo server sees the method, path, query and whole bodies (megabytes,
//! through the port stream's window) and never the caller's API key or token; a WebSocket is bridged both ways.
//! Nothing listening is a 502 naming the port, a bad port a 400. The connection is made by the sandbox's agent
//! inside the sandbox: a listener on the host's own `127.0.0.1:PORT` is never what a port reaches. A sandbox has at
//! most 32 port connections at once (the 33rd is a 409 until one ends); an open WebSocket survives a pause and resume
//! (gVisor: checkpoint and restore, the connection inside the sandbox saved with it).
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::Tier;
use serde_json::{Value, json};
use serve::{KEY_1, KEY_2, Server, assert_sandbox_gone_on};

per_tier!(
    a_server_in_the_sandbox_answers_through_its_port,
    requests_and_answers_pass_whole_and_the_callers_credentials_stay_behind,
    a_websocket_is_bridged_both_ways,
    nothing_listening_is_a_502_naming_the_port_and_bad_ports_are_400,
    the_hosts_loopback_is_never_what_a_port_reaches,
    a_port_host_name_needs_the_traffic_token_unless_the_sandbox_is_public,
    a_sandbox_has_at_most_32_port_connections_at_once,
    an_open_websocket_survives_pause_and_resume,
);

/// An HTTP/1.1 server inside the sandbox: answers every request with what it saw (JSON), `/big/N` with N bytes, and
/// echoes WebSocket text frames back as `echo:…`.
const ECHO_SERVER: &str = r#"
import base64, hashlib, http.server, json, socketserver, sys

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self.websocket()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.path.startswith("/big/"):
            size = int(self.path.split("/")[2])
            out = (bytes(range(256)) * (size // 256 + 1))[:size]
        else:
            out = json.dumps({
                "method": self.command, "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body_len": len(body), "body_sha256": hashlib.sha256(body).hexdigest(),
            }).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = answer

    def websocket(self):
        self.close_connection = True
        key = self.headers["Sec-WebSocket-Key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", base64.b64encode(hashlib.sha1(key.encode()).digest()).decode())
        self.end_headers()
        self.wfile.flush()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            opcode, length = head[0] & 0x0F, head[1] & 0x7F
            if length == 126:
                length = int.from_bytes(self.rfile.read(2), "big")
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(length)))
            if opcode == 8:
                self.wfile.write(b"\x88\x00")
                self.wfile.flush()
                return
            reply = b"echo:" + data
            size = bytes([len(reply)]) if len(reply) < 126 else bytes([126]) + len(reply).to_bytes(2, "big")
            self.wfile.write(bytes([0x81]) + size + reply)
            self.wfile.flush()

    def log_message(self, *args):
        pass

class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"#;

/// A sandbox of `tier` whose commands may run a few minutes.
fn sandbox(server: &Server, tier: Tier) -> String {
    server.create_on(tier, json!({"limits": {"timeout_ms": 300_000}}))
}

/// Starts `cmd` in the background in sandbox `id`.
fn start(server: &Server, id: &str, cmd: &str) {
    let body = json!({"cmd": cmd, "background": true});
    let reply = server.call("POST", &format!("/v1/sandboxes/{id}/exec"), KEY_1, Some(body));
    assert_eq!(reply.status, 202, "{reply:?}");
}

/// Writes the echo server into sandbox `id` and starts it on `port`; returns once it answers.
fn start_echo(server: &Server, id: &str, port: u16) {
    let put = server.put_bytes(&format!("/v1/sandboxes/{id}/files?path=/tmp/echo.py"), KEY_1, ECHO_SERVER.as_bytes());
    assert!(put.status == 204 || put.status == 200, "{put:?}");
    start(server, id, &format!("/usr/bin/python3 /tmp/echo.py {port}"));
    wait_listening(server, id, port);
}

/// A response read off a raw connection.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The server's `host:port`.
fn address(server: &Server) -> String {
    server.url.trim_start_matches("http://").to_owned()
}

/// One HTTP/1.1 request on a new connection (`Connection: close`), with `headers` as given (a `Host` among them
/// replaces the server's address).
fn request(server: &Server, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    let mut stream = TcpStream::connect(address(server)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let host =
        headers.iter().find(|(name, _)| name.eq_ignore_ascii_case("host")).map_or(address(server), |h| h.1.into());
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (name, value) in headers.iter().filter(|(name, _)| !name.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    read_answer(&mut BufReader::new(stream))
}

/// Reads a status line, headers and a body (by length, chunked, or to the end).
fn read_answer(reader: &mut impl BufRead) -> Answer {
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let status = line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status: {line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').unwrap();
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let header = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    let mut body = Vec::new();
    if status == 101 {
        // The connection is the upgraded protocol's now.
    } else if let Some(length) = header("content-length") {
        body.resize(length.parse().unwrap(), 0);
        reader.read_exact(&mut body).unwrap();
    } else if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).unwrap();
            let size = usize::from_str_radix(size.trim(), 16).unwrap();
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).unwrap();
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else {
        reader.read_to_end(&mut body).unwrap();
    }
    Answer { status, headers, body }
}

/// `method` on `path` of port `port` of sandbox `id` through the native route, as t1.
fn native(server: &Server, id: &str, port: u16, method: &str, path: &str, body: &[u8]) -> Answer {
    let auth = format!("Bearer {KEY_1}");
    request(server, method, &format!("/v1/sandboxes/{id}/ports/{port}{path}"), &[("Authorization", &auth)], body)
}

/// Waits (up to 30 s) until something answers on `port` in sandbox `id`.
fn wait_listening(server: &Server, id: &str, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = native(server, id, port, "GET", "/", b"");
        if answer.status != 502 {
            return;
        }
        assert!(Instant::now() < deadline, "nothing came to listen on port {port}: {answer:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn a_server_in_the_sandbox_answers_through_its_port(tier: Tier) {
    let server = Server::start_on(tier);
    let id = sandbox(&server, tier);
    let put = server.put_bytes(&format!("/v1/sandboxes/{id}/files?path=/workspace/hello.txt"), KEY_1, b"hello port");
    assert!(put.status == 204 || put.status == 200, "{put:?}");
    start(&server, &id, "cd /workspace && /usr/bin/python3 -m http.server 8000 --bind 127.0.0.1");
    wait_listening(&server, &id, 8000);
    let answer = native(&server, &id, 8000, "GET", "/hello.txt", b"");
    assert_eq!((answer.status, answer.text().as_str()), (200, "hello port"), "{answer:?}");
    let listing = native(&server, &id, 8000, "GET", "", b"");
    assert_eq!(listing.status, 200, "{listing:?}");
    assert!(listing.text().contains("hello.txt"), "the port's root is the server's /: {listing:?}");
    // Another tenant's sandbox is not found.
    let other = request(
        &server,
        "GET",
        &format!("/v1/sandboxes/{id}/ports/8000/hello.txt"),
        &[("Authorization", &format!("Bearer {KEY_2}"))],
        b"",
    );
    assert_eq!(other.status, 404, "{other:?}");
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    assert_sandbox_gone_on(tier, &id);
}

fn requests_and_answers_pass_whole_and_the_callers_credentials_stay_behind(tier: Tier) {
    let server = Server::start_on(tier);
    let id = sandbox(&server, tier);
    start_echo(&server, &id, 9000);
    let upload: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
    let seen = native(&server, &id, 9000, "POST", "/upload/x?a=1&b=two", &upload);
    assert_eq!(seen.status, 200, "{seen:?}");
    let seen = seen.json();
    assert_eq!(seen["method"], "POST");
    assert_eq!(seen["path"], "/upload/x?a=1&b=two");
    assert_eq!(seen["body_len"], upload.len());
    let sha = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    sha.stdin.as_ref().unwrap().write_all(&upload).unwrap();
    let digest = String::from_utf8(sha.wait_with_output().unwrap().stdout).unwrap();
    assert_eq!(seen["body_sha256"].as_str().unwrap(), digest.split(' ').next().unwrap(), "the body arrived whole");
    assert!(seen["headers"].get("authorization").is_none(), "the API key reached the sandbox: {seen}");
    assert_eq!(seen["headers"]["host"], "localhost:9000");
    let big = native(&server, &id, 9000, "GET", "/big/5000000", b"");
    assert_eq!((big.status, big.body.len()), (200, 5_000_000));
    assert!(big.body.iter().enumerate().all(|(i, b)| *b == (i % 256) as u8), "the answer arrived whole and in order");
    // Many at once: more than one port stream at a time.
    let handles: Vec<_> = (0..8)
        .map(|n| {
            let (url, id) = (server.url.clone(), id.clone());
            std::thread::spawn(move || {
                let mut stream = TcpStream::connect(url.trim_start_matches("http://")).unwrap();
                let head = format!(
                    "GET /v1/sandboxes/{id}/ports/9000/big/{} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_1}\r\nConnection: close\r\n\r\n",
                    300_000 + n
                );
                stream.write_all(head.as_bytes()).unwrap();
                read_answer(&mut BufReader::new(stream)).body.len()
            })
        })
        .collect();
    for (n, handle) in handles.into_iter().enumerate() {
        assert_eq!(handle.join().unwrap(), 300_000 + n);
    }
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    assert_sandbox_gone_on(tier, &id);
}

/// A masked WebSocket text frame (clients mask).
fn ws_frame(text: &str) -> Vec<u8> {
    let mask = [7u8, 1, 2, 3];
    let mut frame = vec![0x81, 0x80 | text.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(text.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    frame
}

/// Reads one unmasked server frame's payload.
fn ws_read(reader: &mut impl Read) -> Vec<u8> {
    let mut head = [0u8; 2];
    reader.read_exact(&mut head).unwrap();
    let mut payload = vec![0; (head[1] & 0x7F) as usize];
    reader.read_exact(&mut payload).unwrap();
    payload
}

/// Opens a WebSocket to `path` with `headers` and returns the connection after the 101.
fn ws_open(server: &Server, path: &str, headers: &[(&str, &str)]) -> BufReader<TcpStream> {
    let mut stream = TcpStream::connect(address(server)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head = format!(
        "GET {path} HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    );
    if !headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("Host: {}\r\n", address(server)));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let answer = read_answer(&mut reader);
    assert_eq!(answer.status, 101, "{answer:?}");
    let accept = answer.headers.iter().find(|(n, _)| n == "sec-websocket-accept").map(|(_, v)| v.as_str());
    assert_eq!(accept, Some("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), "{answer:?}");
    reader
}

fn a_websocket_is_bridged_both_ways(tier: Tier) {
    let server = Server::start_on(tier);
    let id = sandbox(&server, tier);
    start_echo(&server, &id, 9001);
    let auth = format!("Bearer {KEY_1}");
    let mut socket = ws_open(&server, &format!("/v1/sandboxes/{id}/ports/9001/ws"), &[("Authorization", &auth)]);
    for text in ["hello", "from the host", &"x".repeat(100)] {
        socket.get_mut().write_all(&ws_frame(text)).unwrap();
        assert_eq!(ws_read(&mut socket), format!("echo:{text}").as_bytes());
    }
    // A close frame is answered and the connection ends.
    socket.get_mut().write_all(&[0x88, 0x80, 0, 0, 0, 0]).unwrap();
    assert_eq!(ws_read(&mut socket), b"");
    let mut rest = Vec::new();
    socket.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{rest:?}");
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    assert_sandbox_gone_on(tier, &id);
}

fn nothing_listening_is_a_502_naming_the_port_and_bad_ports_are_400(tier: Tier) {
    let server = Server::start_on(tier);
    let id = sandbox(&server, tier);
    let refused = native(&server, &id, 8123, "GET", "/", b"");
    assert_eq!(refused.status, 502, "{refused:?}");
    assert_eq!(refused.json()["error"]["code"], "nothing_listening", "{refused:?}");
    let message = refused.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("nothing listens on port 8123"), "{message}");
    let auth = format!("Bearer {KEY_1}");
    for bad in ["0", "65536", "99999999999", "http"] {
        let answer =
            request(&server, "GET", &format!("/v1/sandboxes/{id}/ports/{bad}/"), &[("Authorization", &auth)], b"");
        assert_eq!(answer.status, 400, "{bad}: {answer:?}");
        assert_eq!(answer.json()["error"]["code"], "bad_request", "{answer:?}");
    }
    let anonymous = request(&server, "GET", &format!("/v1/sandboxes/{id}/ports/8123/"), &[], b"");
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    let ended = native(&server, &id, 8123, "GET", "/", b"");
    assert!(matches!(ended.status, 404 | 409), "{ended:?}");
    assert_sandbox_gone_on(tier, &id);
}

fn the_hosts_loopback_is_never_what_a_port_reaches(tier: Tier) {
    // A service on the host's own loopback, counting who connects to it.
    let host_service = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = host_service.local_addr().unwrap().port();
    host_service.set_nonblocking(true).unwrap();
    let reached = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&reached);
    let watcher = std::thread::spawn(move || {
        let until = Instant::now() + Duration::from_secs(90);
        while Instant::now() < until && counter.load(Ordering::SeqCst) < usize::MAX {
            if let Ok((mut connection, _)) = host_service.accept() {
                counter.fetch_add(1, Ordering::SeqCst);
                let _ = connection.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nhost");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    let server = Server::start_on(tier);
    let id = sandbox(&server, tier);
    let refused = native(&server, &id, port, "GET", "/", b"");
    assert_eq!(refused.status, 502, "the host's 127.0.0.1:{port} was reached: {refused:?}");
    // The sandbox's own server on the same port number is what answers.
    start_echo(&server, &id, port);
    let answer = native(&server, &id, port, "GET", "/mine", b"");
    assert_eq!((answer.status, answer.json()["path"].clone()), (200, json!("/mine")), "{answer:?}");
    assert_eq!(reached.load(Ordering::SeqCst), 0, "a port request connected to the host's loopback service");
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    assert_sandbox_gone_on(tier, &id);
    reached.store(usize::MAX, Ordering::SeqCst);
    watcher.join().unwrap();
}

/// The tenant key of the E2B facade's control plane in these tests (t1's).
fn e2b_create(server: &Server, network: Value) -> (String, String) {
    let mut response = server
        .http()
        .post(format!("{}/sandboxes", server.url))
        .header("X-API-KEY", KEY_1)
        .send_json(json!({"templateID": "base", "timeout": 300, "network": network}))
        .unwrap();
    let created: Value = serde_json::from_slice(&response.body_mut().read_to_vec().unwrap()).unwrap();
    let id = created["sandboxID"].as_str().unwrap_or_else(|| panic!("{created}")).to_owned();
    (id, created["trafficAccessToken"].as_str().unwrap().to_owned())
}

fn a_port_host_name_needs_the_traffic_token_unless_the_sandbox_is_public(tier: Tier) {
    let server = Server::start_on(tier);
    let (id, token) = e2b_create(&server, json!({"allowPublicTraffic": false}));
    start_echo(&server, &id, 8080);
    let host = format!("8080-{id}.e2b.app");
    let without = request(&server, "GET", "/via-host?q=1", &[("Host", &host)], b"");
    assert_eq!(without.status, 403, "{without:?}");
    assert!(without.json()["message"].as_str().unwrap().contains("e2b-traffic-access-token"), "{without:?}");
    let wrong = request(&server, "GET", "/", &[("Host", &host), ("e2b-traffic-access-token", "nope")], b"");
    assert_eq!(wrong.status, 403, "{wrong:?}");
    let with = request(&server, "GET", "/via-host?q=1", &[("Host", &host), ("e2b-traffic-access-token", &token)], b"");
    assert_eq!(with.status, 200, "{with:?}");
    assert_eq!(with.json()["path"], "/via-host?q=1");
    assert!(with.json()["headers"].get("e2b-traffic-access-token").is_none(), "the token reached the sandbox");
    assert_eq!(with.json()["headers"]["host"], host.as_str(), "the program sees the name it was called by");
    let socket_host = [("Host", host.as_str()), ("e2b-traffic-access-token", token.as_str())];
    let mut socket = ws_open(&server, "/ws", &socket_host);
    socket.get_mut().write_all(&ws_frame("via host")).unwrap();
    assert_eq!(ws_read(&mut socket), b"echo:via host");
    drop(socket);
    let closed = request(
        &server,
        "GET",
        "/",
        &[("Host", &format!("8081-{id}.e2b.app")), ("e2b-traffic-access-token", &token)],
        b"",
    );
    assert_eq!(closed.status, 502, "{closed:?}");
    assert_eq!((closed.json()["port"].clone(), closed.json()["sandboxId"].clone()), (json!(8081), json!(id)));
    let bad = request(&server, "GET", "/", &[("Host", &format!("70000-{id}.e2b.app"))], b"");
    assert_eq!(bad.status, 400, "{bad:?}");
    let unknown = request(&server, "GET", "/", &[("Host", "8080-sb-00000000000000ff.e2b.app")], b"");
    assert_eq!(unknown.status, 502, "{unknown:?}");

    let (public, _) = e2b_create(&server, json!({"allowPublicTraffic": true}));
    start_echo(&server, &public, 8080);
    let open = request(&server, "GET", "/anyone", &[("Host", &format!("8080-{public}.e2b.app"))], b"");
    assert_eq!((open.status, open.json()["path"].clone()), (200, json!("/anyone")), "{open:?}");
    for sandbox in [id, public] {
        assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{sandbox}"), KEY_1, None).status, 204);
        assert_sandbox_gone_on(tier, &sandbox);
    }
}

fn a_sandbox_has_at_most_32_port_connections_at_once(tier: Tier) {
    let server = Server::start_on(tier);
    let id = sandbox(&server, tier);
    start_echo(&server, &id, 9002);
    let auth = format!("Bearer {KEY_1}");
    let path = format!("/v1/sandboxes/{id}/ports/9002/ws");
    // The readiness probes' connections end on their own (both sides' EOF travel back): give them a moment.
    std::thread::sleep(Duration::from_secs(1));
    let mut open: Vec<_> = (0..32).map(|_| ws_open(&server, &path, &[("Authorization", &auth)])).collect();
    let refused = native(&server, &id, 9002, "GET", "/one-more", b"");
    assert_eq!(refused.status, 409, "{refused:?}");
    assert!(refused.text().contains("32 port connections open already"), "{refused:?}");
    // Every connection still works, and one ending makes room.
    for socket in &mut open {
        socket.get_mut().write_all(&ws_frame("still here")).unwrap();
        assert_eq!(ws_read(socket), b"echo:still here");
    }
    drop(open.pop());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = native(&server, &id, 9002, "GET", "/after", b"");
        if answer.status == 200 {
            break;
        }
        assert_eq!(answer.status, 409, "{answer:?}");
        assert!(Instant::now() < deadline, "no room came back after a connection ended");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(open);
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    assert_sandbox_gone_on(tier, &id);
}

fn an_open_websocket_survives_pause_and_resume(tier: Tier) {
    let server = Server::start_on(tier);
    let id = sandbox(&server, tier);
    start_echo(&server, &id, 9003);
    let auth = format!("Bearer {KEY_1}");
    let mut socket = ws_open(&server, &format!("/v1/sandboxes/{id}/ports/9003/ws"), &[("Authorization", &auth)]);
    socket.get_mut().write_all(&ws_frame("before")).unwrap();
    assert_eq!(ws_read(&mut socket), b"echo:before");
    for what in ["pause", "resume"] {
        let reply = server.call("POST", &format!("/v1/sandboxes/{id}/{what}"), KEY_1, None);
        assert_eq!(reply.status, 200, "{what}: {reply:?}");
    }
    socket.get_mut().write_all(&ws_frame("after")).unwrap();
    assert_eq!(ws_read(&mut socket), b"echo:after");
    drop(socket);
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    assert_sandbox_gone_on(tier, &id);
}
