//! Network attacks with the default policy (no network): the host's loopback listeners, the host's external address,
//! abstract unix sockets, DNS and the internet are all unreachable; only `lo` exists inside. Socket buffers on the
//! sandbox's own loopback are charged: they cannot take the host's TCP or UDP memory beyond the sandbox's memory
//! limit.
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use std::net::{IpAddr, TcpListener};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::time::{Duration, Instant};

use common::*;

per_tier!(
    host_loopback_listener_is_unreachable,
    host_external_address_is_unreachable,
    no_route_leaves_the_sandbox_and_no_name_resolves,
    only_loopback_interface_exists,
    sandbox_loopback_works_but_is_private,
    host_abstract_unix_socket_is_unreachable,
    socket_buffers_cannot_take_host_tcp_memory_beyond_the_memory_limit,
    one_tcp_connection_queues_at_most_its_namespaces_buffer_sizes,
    udp_buffers_cannot_take_host_udp_memory_beyond_the_memory_limit,
);

/// Python that tries a TCP connect and prints `connected` or the error class.
fn connect_code(host: &str, port: u16) -> String {
    format!(
        "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\ns.settimeout(2)\ntry:\n    s.connect(({host:?}, {port}))\n    s.sendall(b'SANDBOX-WAS-HERE')\n    print('CONNECTED')\nexcept OSError as e:\n    print('failed', type(e).__name__, e.errno)\n"
    )
}

fn host_loopback_listener_is_unreachable(tier: Tier) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    // Positive control: the listener is reachable from the host.
    let probe = std::net::TcpStream::connect(("127.0.0.1", port)).expect("host connects to its own listener");
    assert_eq!(accepted_within(&listener, Duration::from_millis(300)), 1, "positive control");
    drop(probe);
    let r = code_on(tier, "python", &connect_code("127.0.0.1", port), &["--timeout", "10s"]).json();
    r.assert_exit(0);
    assert!(!r.stdout().contains("CONNECTED"), "{}", r.describe());
    assert!(
        r.stdout().contains("ConnectionRefusedError")
            || r.stdout().contains("unreachable")
            || r.stdout().contains(" 101"),
        "expected refused/unreachable\n{}",
        r.describe()
    );
    assert_eq!(accepted_within(&listener, Duration::from_millis(500)), 0, "the host listener got a connection");
    assert_gone(tier, &r.id());
}

fn host_external_ipv4() -> Option<IpAddr> {
    // The host's first non-loopback IPv4 address, read from its interfaces (no traffic, no outside address named).
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cursor = list;
    while !cursor.is_null() && found.is_none() {
        // SAFETY: `cursor` walks the list getifaddrs returned; each node and its address stay valid until freeifaddrs.
        let entry = unsafe { &*cursor };
        // SAFETY: a non-null ifa_addr points to a sockaddr owned by the list.
        let family = if entry.ifa_addr.is_null() { -1 } else { i32::from(unsafe { (*entry.ifa_addr).sa_family }) };
        if family == libc::AF_INET {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let v4 = unsafe { &*(entry.ifa_addr as *const libc::sockaddr_in) };
            let ip = std::net::Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr));
            if !ip.is_loopback() && !ip.is_unspecified() {
                found = Some(IpAddr::V4(ip));
            }
        }
        cursor = entry.ifa_next;
    }
    // SAFETY: frees the list getifaddrs allocated; not used afterwards.
    unsafe { libc::freeifaddrs(list) };
    found
}

fn host_external_address_is_unreachable(tier: Tier) {
    let Some(ip) = host_external_ipv4() else {
        eprintln!("skipped: the host has no non-loopback IPv4 address");
        return;
    };
    let listener = TcpListener::bind((ip, 0)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let r = code_on(tier, "python", &connect_code(&ip.to_string(), port), &["--timeout", "10s"]).json();
    r.assert_exit(0);
    assert!(!r.stdout().contains("CONNECTED"), "{}", r.describe());
    assert!(r.stdout().contains("failed"), "{}", r.describe());
    assert_eq!(accepted_within(&listener, Duration::from_millis(500)), 0, "the host listener on {ip} got a connection");
    assert_gone(tier, &r.id());
}

fn no_route_leaves_the_sandbox_and_no_name_resolves(tier: Tier) {
    // Only the host's own address is named: the point is that nothing has a route out of the sandbox at all, which
    // the kernel answers at once (ENETUNREACH), so no packet is ever sent anywhere.
    let Some(ip) = host_external_ipv4() else {
        eprintln!("skipped: the host has no non-loopback IPv4 address");
        return;
    };
    let code = format!(
        "import socket\n\
         routes = open('/proc/net/route').read().splitlines()[1:]\n\
         print('ipv4-routes', len(routes))\n\
         print('nameservers', [l for l in open('/etc/resolv.conf') if l.startswith('nameserver')])\n\
         s = socket.socket(); s.settimeout(2)\n\
         try:\n\
         \x20   s.connect(('{ip}', 53)); print('CONNECTED')\n\
         except OSError as e:\n\
         \x20   print('tcp failed', e.errno)\n\
         u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         try:\n\
         \x20   u.sendto(b'x', ('{ip}', 53)); print('SENT-UDP')\n\
         except OSError as e:\n\
         \x20   print('udp failed', e.errno)\n\
         try:\n\
         \x20   print('RESOLVED', socket.getaddrinfo('sandkasten-test.invalid', 80)[0][4])\n\
         except OSError as e:\n\
         \x20   print('dns failed', e)\n"
    );
    let r = code_on(tier, "python", &code, &["--timeout", "15s"]).json();
    r.assert_exit(0);
    let stdout = r.stdout();
    assert!(stdout.contains("ipv4-routes 0"), "the sandbox must have no IPv4 route at all\n{}", r.describe());
    assert!(stdout.contains("nameservers []"), "{}", r.describe());
    // gVisor's network stack answers a destination without a route with EHOSTUNREACH (113), Linux with ENETUNREACH.
    let errno = if tier == Tier::Gvisor { 113 } else { 101 };
    let (tcp, udp) = (format!("tcp failed {errno}"), format!("udp failed {errno}"));
    assert!(stdout.contains(&tcp) && stdout.contains(&udp), "{}", r.describe());
    assert!(!stdout.contains("CONNECTED") && !stdout.contains("SENT-UDP"), "{}", r.describe());
    assert!(!stdout.contains("RESOLVED"), "{}", r.describe());
    assert_gone(tier, &r.id());
}

fn only_loopback_interface_exists(tier: Tier) {
    let code = "import socket\n\
                names = [l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]]\n\
                print('proc-net-dev', sorted(names))\n\
                try:\n\
                \x20   print('if_nameindex', sorted(n for _, n in socket.if_nameindex()))\n\
                except OSError as e:\n\
                \x20   print('if_nameindex failed', e.errno)\n";
    let r = code_on(tier, "python", code, &[]).json();
    r.assert_exit(0);
    assert!(r.stdout().contains("proc-net-dev ['lo']"), "{}", r.describe());
    assert!(
        r.stdout().contains("if_nameindex ['lo']") || r.stdout().contains("if_nameindex failed"),
        "{}",
        r.describe()
    );
    assert_gone(tier, &r.id());
    let ip = code_on(tier, "bash", "ip -o link 2>&1 | awk -F': ' '{print $2}'", &[]).json();
    let names: Vec<String> = ip.stdout().lines().map(|l| l.trim().to_owned()).filter(|l| !l.is_empty()).collect();
    assert!(
        names == ["lo"]
            || ip.stdout().contains("Cannot open netlink")
            || ip.stdout().contains("Operation not permitted"),
        "ip link shows {names:?}\n{}",
        ip.describe()
    );
    assert_gone(tier, &ip.id());
}

fn sandbox_loopback_works_but_is_private(tier: Tier) {
    // Positive control inside: loopback works within the sandbox. A host listener on the same port is not reached.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let code = format!(
        "import socket\nsrv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\nsrv.bind(('127.0.0.1', {port})); srv.listen(1)\nc = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nconn, _ = srv.accept(); c.sendall(b'ping'); print('inside', conn.recv(4).decode())\n"
    );
    let r = code_on(tier, "python", &code, &["--timeout", "10s"]).json();
    r.assert_exit(0);
    assert_eq!(r.stdout(), "inside ping\n", "{}", r.describe());
    assert_eq!(accepted_within(&listener, Duration::from_millis(300)), 0);
    assert_gone(tier, &r.id());
}

fn host_abstract_unix_socket_is_unreachable(tier: Tier) {
    let name = unique_token("sandkasten-test-");
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = UnixListener::bind_addr(&addr).unwrap();
    listener.set_nonblocking(true).unwrap();
    let code = format!(
        "import socket\ns = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\ntry:\n    s.connect('\\0{name}'); print('CONNECTED')\nexcept OSError as e:\n    print('failed', type(e).__name__)\n"
    );
    let r = code_on(tier, "python", &code, &["--timeout", "10s"]).json();
    r.assert_exit(0);
    assert!(!r.stdout().contains("CONNECTED"), "{}", r.describe());
    assert!(r.stdout().contains("failed"), "{}", r.describe());
    let mut got = 0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(300) {
        if listener.accept().is_ok() {
            got += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(got, 0, "the host's abstract socket got a connection");
    assert_gone(tier, &r.id());
}

/// Pages of buffer memory the host's kernel holds for one protocol's sockets (`TCP:`, `UDP:` in `/proc/net/sockstat`,
/// global across network namespaces).
fn host_socket_memory_pages(protocol: &str) -> u64 {
    let stat = std::fs::read_to_string("/proc/net/sockstat").unwrap();
    let line = stat.lines().find(|l| l.starts_with(protocol)).unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    let at = fields.iter().position(|f| *f == "mem").unwrap();
    fields[at + 1].parse().unwrap()
}

/// Runs Python `code` in a 64 MiB sandbox of `tier` and measures, on the host, how much `protocol`'s socket memory
/// grew by the time the code printed its first line (while it still holds its sockets): that line, the growth in
/// bytes, and how the run ended.
fn socket_memory_while_it_runs(
    tier: Tier,
    code: &str,
    timeout: &str,
    protocol: &str,
) -> (String, u64, std::process::ExitStatus) {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let before = host_socket_memory_pages(protocol);
    let mut child = Command::new(bin())
        .args(["run", "--isolation", tier.name(), "--memory", "64MiB", "--timeout", timeout, "--lang", "python"])
        .args(["--code", code])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let during = host_socket_memory_pages(protocol);
    let status = child.wait().unwrap();
    (line, during.saturating_sub(before) * 4096, status)
}

/// 40 loopback TCP connections inside a 64 MiB sandbox, each written to until the kernel refuses more (the reader
/// never reads): the host's TCP memory grows by about the sandbox's memory limit at most (unbounded on cgroup v1
/// without the sandbox's `memory.kmem.tcp.limit_in_bytes`: 419 MiB was measured), while the sandbox holds them.
fn socket_buffers_cannot_take_host_tcp_memory_beyond_the_memory_limit(tier: Tier) {
    let code = "import socket, time\n\
        srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen(64)\n\
        port = srv.getsockname()[1]\n\
        held = []; total = 0; chunk = b'x' * 65536\n\
        for i in range(40):\n\
        \x20   c = socket.create_connection(('127.0.0.1', port)); p, _ = srv.accept()\n\
        \x20   c.setblocking(False); held += [c, p]\n\
        \x20   while True:\n\
        \x20       try:\n\
        \x20           total += c.send(chunk)\n\
        \x20       except OSError:\n\
        \x20           break\n\
        print('full', total, flush=True)\n\
        time.sleep(3)\n";
    let (line, grown, status) = socket_memory_while_it_runs(tier, code, "30s", "TCP:");
    eprintln!("{tier}: {line:?}, host TCP memory grew by {grown} bytes, run ended {status}");
    assert!(grown < 96 << 20, "the sandbox's sockets took {grown} bytes of the host's TCP memory ({line:?})");
    if tier == Tier::Process {
        let queued: u64 = line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0);
        assert!(line.starts_with("full ") && queued > 0, "the attack did not run: {line:?} ({status})");
        assert!(queued < 96 << 20, "the kernel queued {queued} bytes for a 64 MiB sandbox");
    }
}

/// The sandbox's network namespace has TCP buffers of at most 1 MiB each way (per-namespace sysctls; the host's stay
/// as they are): one connection whose reader never reads queues a few MiB at most, where the host's sizes let it
/// queue about ten.
fn one_tcp_connection_queues_at_most_its_namespaces_buffer_sizes(tier: Tier) {
    let host_sizes =
        || ["tcp_rmem", "tcp_wmem"].map(|name| std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}")).unwrap());
    let before = host_sizes();
    let code = "import socket\n\
        srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen(1)\n\
        c = socket.create_connection(srv.getsockname()); p, _ = srv.accept()\n\
        c.setblocking(False); total = 0\n\
        while True:\n\
        \x20   try:\n\
        \x20       total += c.send(b'x' * 65536)\n\
        \x20   except OSError:\n\
        \x20       break\n\
        print(total, open('/proc/sys/net/ipv4/tcp_rmem').read().split(), open('/proc/sys/net/ipv4/tcp_wmem').read().split())\n";
    let r = run_on(tier, ["--memory", "256MiB", "--lang", "python", "--code", code]).json();
    r.assert_exit(0);
    assert_eq!(host_sizes(), before, "the host's TCP buffer sizes changed");
    if tier == Tier::Process {
        let queued: u64 = r.stdout().split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0);
        assert!(queued > 0 && queued < 4 << 20, "one connection queued {queued} bytes\n{}", r.describe());
        assert!(r.stdout().contains("'4096', '131072', '1048576'"), "{}", r.describe());
    }
}

/// 40 loopback UDP receivers inside a 64 MiB sandbox, each asking for a 64 MiB receive buffer (the kernel grants
/// twice the host's `net.core.rmem_max`, which a network namespace cannot lower) and sent datagrams it never reads:
/// the host's UDP memory grows by about the sandbox's memory limit at most. On cgroup v1 UDP buffers are charged to
/// the same `memory.kmem.tcp.limit_in_bytes` as TCP's (without it, 317 MiB were measured here); on v2 to `memory.max`;
/// on gVisor they are the Sentry's netstack memory, not the host kernel's.
fn udp_buffers_cannot_take_host_udp_memory_beyond_the_memory_limit(tier: Tier) {
    let code = "import socket, time\n\
        held = []; payload = b'x' * 60000\n\
        for i in range(40):\n\
        \x20   r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
        \x20   r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20); r.bind(('127.0.0.1', 0))\n\
        \x20   s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.setblocking(False); held += [r, s]\n\
        \x20   for k in range(300):\n\
        \x20       try:\n\
        \x20           s.sendto(payload, r.getsockname())\n\
        \x20       except BlockingIOError:\n\
        \x20           time.sleep(0.001)\n\
        queued = 0\n\
        try:\n\
        \x20   for row in open('/proc/net/udp').read().splitlines()[1:]:\n\
        \x20       queued += int(row.split()[4].split(':')[1], 16)\n\
        except (OSError, IndexError, ValueError):\n\
        \x20   queued = -1\n\
        print('queued', queued, held[0].getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF), flush=True)\n\
        time.sleep(3)\n";
    let (line, grown, status) = socket_memory_while_it_runs(tier, code, "60s", "UDP:");
    eprintln!("{tier}: {line:?}, host UDP memory grew by {grown} bytes, run ended {status}");
    assert!(grown < 96 << 20, "the sandbox's UDP sockets took {grown} bytes of the host's UDP memory ({line:?})");
    if tier == Tier::Process {
        let fields: Vec<u64> = line.split_whitespace().skip(1).filter_map(|n| n.parse().ok()).collect();
        let (queued, rcvbuf) = (fields.first().copied().unwrap_or(0), fields.get(1).copied().unwrap_or(0));
        assert!(line.starts_with("queued ") && queued > 0, "the attack did not run: {line:?} ({status})");
        assert!(rcvbuf >= 4 << 20, "each receiver may queue {rcvbuf} bytes: too few for 40 to pass 64 MiB ({line:?})");
        assert!(queued < 96 << 20, "the kernel queued {queued} bytes of UDP for a 64 MiB sandbox");
    }
}
