//! Test hosts in network namespaces the test creates itself: `ip netns` + a veth pair, an address on each end, and a
//! small HTTP server inside that serves a directory (a PEP 503 index, a bare git repository for git's dumb HTTP
//! protocol, plain files) and logs every request's headers to a file the test reads. Dropping a host kills its
//! server and deletes the namespace (which deletes both veth ends and the host route). Never any address but these.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The HTTP server run inside a test host: serves `ROOT` on `ADDR:PORT`, answers `/whoami` with the host's name, and
/// appends `METHOD PATH` + the request headers of every request to `LOG`. With TLS it also logs each handshake:
/// `TLS-SNI <name>` when a ClientHello carries a server name, then `TLS-OK` or `TLS-FAILED <error>`.
const SERVER: &str = r#"
import http.server, sys, os
addr, port, root, log, name = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
tls = sys.argv[6:8]
class Handler(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *a, **k):
        super().__init__(*a, directory=root, **k)
    def log_message(self, *a):
        pass
    def record(self):
        with open(log, "a") as f:
            f.write(f"{self.command} {self.path}\n{self.headers}\n")
    def do_GET(self):
        self.record()
        if self.path == "/whoami":
            body = f"hello from {name}\n".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()
    def do_POST(self):
        self.record()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
def note(line):
    with open(log, "a") as f:
        f.write(line + "\n")
if tls:
    import ssl
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls[0], tls[1])
    context.sni_callback = lambda sock, name, ctx: note(f"TLS-SNI {name}")
class Server(http.server.ThreadingHTTPServer):
    allow_reuse_address = True
    def get_request(self):
        sock, peer = self.socket.accept()
        if not tls:
            return sock, peer
        sock.settimeout(10)
        try:
            sock = context.wrap_socket(sock, server_side=True)
        except OSError as e:
            note(f"TLS-FAILED {type(e).__name__}")
            raise
        note("TLS-OK")
        sock.settimeout(None)
        return sock, peer
server = Server((addr, port), Handler)
server.serve_forever()
"#;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A web server at `addr` in its own network namespace, reachable from the host through a veth pair.
pub struct TestHost {
    /// The namespace's name.
    pub netns: String,
    /// The server's address.
    pub addr: String,
    /// Its port.
    pub port: u16,
    /// The directory it serves.
    pub root: tempfile::TempDir,
    log: PathBuf,
    server: Option<Child>,
}

fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("run ip");
    assert!(status.success(), "ip {} failed", args.join(" "));
}

impl TestHost {
    /// Starts a host named `name` at `addr/30`, the host's end of the veth taking `host_addr`. Both addresses must be
    /// in a /30 of their own that nothing else on this machine uses.
    pub fn start(name: &str, host_addr: &str, addr: &str, port: u16) -> TestHost {
        TestHost::start_with_tls(name, host_addr, addr, port, None)
    }

    /// As `start`, serving HTTPS with `(certificate, key)` PEM files.
    pub fn start_with_tls(name: &str, host_addr: &str, addr: &str, port: u16, tls: Option<(&Path, &Path)>) -> TestHost {
        remove_stale_hosts();
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let tag = format!("{}x{n}", std::process::id());
        let netns = format!("sk-test-{tag}");
        let (outer, inner) = (format!("skh{tag}"), format!("skn{tag}"));
        ip(&["netns", "add", &netns]);
        let mut host = TestHost {
            netns: netns.clone(),
            addr: addr.to_owned(),
            port,
            root: tempfile::tempdir().expect("tempdir"),
            log: PathBuf::new(),
            server: None,
        };
        ip(&["link", "add", &outer, "type", "veth", "peer", "name", &inner]);
        ip(&["link", "set", &inner, "netns", &netns]);
        ip(&["addr", "add", &format!("{host_addr}/30"), "dev", &outer]);
        ip(&["link", "set", &outer, "up"]);
        ip(&["-n", &netns, "addr", "add", &format!("{addr}/30"), "dev", &inner]);
        ip(&["-n", &netns, "link", "set", &inner, "up"]);
        ip(&["-n", &netns, "link", "set", "lo", "up"]);
        host.log = host.root.path().join(".requests.log");
        let server = Command::new("ip")
            .args(["netns", "exec", &netns, "/usr/bin/python3", "-c", SERVER, addr, &port.to_string()])
            .arg(host.root.path())
            .arg(&host.log)
            .arg(name)
            .args(tls.map(|(cert, key)| [cert.to_owned(), key.to_owned()]).into_iter().flatten())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start the test host's server");
        host.server = Some(server);
        host.wait_until_serving();
        host
    }

    fn wait_until_serving(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let target = format!("{}:{}", self.addr, self.port);
        while std::net::TcpStream::connect_timeout(&target.parse().expect("addr"), Duration::from_millis(200)).is_err()
        {
            assert!(Instant::now() < deadline, "test host {target} did not start serving");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every request the server received so far: request lines and headers, as text.
    pub fn requests(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Where the served files live.
    pub fn dir(&self) -> &Path {
        self.root.path()
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        if let Some(mut server) = self.server.take() {
            server.kill().ok();
            server.wait().ok();
        }
        // Deleting the namespace deletes the inner veth end, which deletes its peer and the host's route.
        Command::new("ip").args(["netns", "del", &self.netns]).status().ok();
    }
}

/// The test-host namespaces on this machine: `sk-test-PIDxN`, with the pid of the test process that made each.
fn test_namespaces() -> Vec<(String, Option<u32>)> {
    let out = Command::new("ip").args(["netns", "list"]).output().expect("ip netns list");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter_map(|name| {
            let tag = name.strip_prefix("sk-test-")?;
            let pid = tag.split_once('x').and_then(|(pid, _)| pid.parse().ok());
            Some((name.to_owned(), pid))
        })
        .collect()
}

/// Deletes the test hosts of test processes that are gone (killed before their hosts' `Drop` ran): their servers,
/// namespaces and host-side veth ends, whose addresses would otherwise shadow the next run's hosts.
fn remove_stale_hosts() {
    for (netns, pid) in test_namespaces() {
        let owner_alive = pid.is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        if owner_alive {
            continue;
        }
        let pids = Command::new("ip").args(["netns", "pids", &netns]).output().map(|o| o.stdout).unwrap_or_default();
        for server in String::from_utf8_lossy(&pids).split_whitespace() {
            Command::new("kill").args(["-9", server]).status().ok();
        }
        Command::new("ip").args(["netns", "del", &netns]).status().ok();
        let tag = netns.trim_start_matches("sk-test-");
        Command::new("ip").args(["link", "del", &format!("skh{tag}")]).stderr(Stdio::null()).status().ok();
    }
}

/// The network namespaces this test process made that are still there (the leak check).
pub fn leftover_namespaces() -> Vec<String> {
    let me = std::process::id();
    test_namespaces().into_iter().filter(|(_, pid)| *pid == Some(me)).map(|(name, _)| name).collect()
}
