//! The proxy's decisions over real sockets (loopback only): CONNECT and plain HTTP allowed and refused, the
//! special-range check after resolution (static entries to metadata and loopback, odd IP spellings) with no
//! connect attempt, live policy changes, upstream failures, hostile input, idle timeouts, and the audit of each
//! attempt (and the sandbox's live traffic count).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::*;
use sandkasten_egress::{Decision, EgressConfig, Mode, Policy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[tokio::test]
async fn connect_to_allowed_host_tunnels_bytes_and_audits_them() {
    let echo = echo_upstream().await;
    let p = start_proxy(loopback_config(&[]), allowlist(&["allowed.test"]), None).await;
    let mut c = client(&p).await;
    let req = format!("CONNECT allowed.test:{0} HTTP/1.1\r\nHost: allowed.test:{0}\r\n\r\n", echo.port());
    c.write_all(req.as_bytes()).await.unwrap();
    let (head, _) = read_message(&mut c).await.unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    c.write_all(b"ping-through-tunnel").await.unwrap();
    let mut back = [0u8; 19];
    c.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"ping-through-tunnel");
    // The sandbox's traffic counts live, while the tunnel is open (the audit has it only when the tunnel ends).
    assert_eq!((p.sandbox.traffic().bytes_up(), p.sandbox.traffic().bytes_down()), (19, 19));
    drop(c);
    let events = p.audit.wait_for(1).await;
    let e = &events[0];
    assert_eq!((e.scheme.as_str(), e.host.as_str(), e.port), ("connect", "allowed.test", echo.port()));
    assert_eq!(e.decision, Decision::Allowed);
    assert_eq!(e.resolved, Some("127.0.0.1".parse().unwrap()));
    assert_eq!(e.rule, "allow \"allowed.test\"; 127.0.0.1 in egress.allow_cidrs 127.0.0.1/32");
    assert_eq!((e.bytes_up, e.bytes_down), (19, 19));
    assert_eq!((e.sandbox_id.as_str(), e.tenant.as_str()), ("sb-test", "tenant-a"));
    let json = serde_json::to_value(e).unwrap();
    assert_eq!(json["decision"], "allowed");
}

#[tokio::test]
async fn connect_to_unlisted_host_is_refused_with_403_naming_the_rule() {
    let p = start_proxy(loopback_config(&[]), allowlist(&["allowed.test"]), None).await;
    let mut c = client(&p).await;
    let (status, _, body) = roundtrip(&mut c, "CONNECT api.evil.test:443 HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(status, 403);
    assert_eq!(body, "sandkasten egress: refused api.evil.test:443: not in the allowlist\n");
    let events = p.audit.wait_for(1).await;
    assert_eq!(events[0].decision, Decision::Refused);
    assert_eq!(events[0].rule, "not in allowlist");
    assert_eq!(events[0].resolved, None, "refused before resolving");
}

#[tokio::test]
async fn plain_http_is_forwarded_and_refused_on_one_keepalive_connection() {
    let (up, received) = http_upstream().await;
    let p = start_proxy(loopback_config(&[]), allowlist(&["allowed.test"]), None).await;
    let mut c = client(&p).await;
    let req = format!(
        "GET http://Allowed.Test.:{}/x?y=1 HTTP/1.1\r\nHost: allowed.test\r\nProxy-Connection: keep-alive\r\n\
         Proxy-Authorization: Basic c2VjcmV0\r\n\r\n",
        up.port()
    );
    let (status, _, body) = roundtrip(&mut c, &req).await;
    assert_eq!((status, body.as_str()), (200, "hello"));
    let (head, _) = received.lock().unwrap()[0].clone();
    assert!(head.starts_with("GET /x?y=1 HTTP/1.1\r\n"), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains(&format!("host: allowed.test:{}\r\n", up.port())), "{head}");
    assert!(!lower.contains("proxy-"), "proxy headers must not be forwarded: {head}");
    assert!(lower.contains("connection: close"), "{head}");

    let (status, _, body) = roundtrip(&mut c, "GET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n").await;
    assert_eq!(status, 403);
    assert_eq!(body, "sandkasten egress: refused evil.test:80: not in the allowlist\n");

    let events = p.audit.wait_for(2).await;
    let allowed = events.iter().find(|e| e.decision == Decision::Allowed).unwrap();
    assert_eq!((allowed.scheme.as_str(), allowed.host.as_str()), ("http", "allowed.test"));
    assert!(allowed.bytes_up > 0 && allowed.bytes_down > 0, "{allowed:?}");
    let refused = events.iter().find(|e| e.decision == Decision::Refused).unwrap();
    assert_eq!((refused.host.as_str(), refused.port), ("evil.test", 80));
}

#[tokio::test]
async fn static_entries_to_metadata_or_unlisted_loopback_are_refused_without_connecting() {
    // 127.0.0.2 is loopback but only 127.0.0.1/32 is allowed: a listener there must never see a connection.
    let trap = TcpListener::bind("127.0.0.2:0").await.unwrap();
    let port = trap.local_addr().unwrap().port();
    let cfg = loopback_config(&[("meta.test", "169.254.169.254"), ("trap.test", "127.0.0.2")]);
    let p = start_proxy(cfg, allowlist(&["meta.test", "trap.test"]), None).await;
    let mut c = client(&p).await;
    let (status, _, body) =
        roundtrip(&mut c, "GET http://meta.test/latest/meta-data/ HTTP/1.1\r\nHost: m\r\n\r\n").await;
    assert_eq!(status, 403);
    assert_eq!(
        body,
        "sandkasten egress: refused meta.test:80: resolves to 169.254.169.254 (link-local, cloud metadata \
         endpoint) which is never allowed\n"
    );
    let (status, _, body) = roundtrip(&mut c, &format!("CONNECT trap.test:{port} HTTP/1.1\r\nHost: t\r\n\r\n")).await;
    assert_eq!(status, 403);
    assert!(body.contains("resolves to 127.0.0.2 (loopback, an address of this host"), "{body}");
    let (status, _, _) = roundtrip(&mut c, &format!("GET http://trap.test:{port}/ HTTP/1.1\r\nHost: t\r\n\r\n")).await;
    assert_eq!(status, 403);
    assert!(!got_connection(&trap).await, "the proxy connected to a refused address");
    let events = p.audit.wait_for(3).await;
    assert!(events.iter().all(|e| e.decision == Decision::Refused));
    assert_eq!(events[0].resolved, Some("169.254.169.254".parse().unwrap()));
    assert_eq!(events[0].rule, "special range link-local, cloud metadata endpoint");
}

#[tokio::test]
async fn odd_spellings_of_loopback_are_refused_when_127_is_not_allowed() {
    let target = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = target.local_addr().unwrap().port();
    let open = Policy::compile(Mode::Open, &[], &[]).unwrap();
    let p = start_proxy(EgressConfig::default(), open, None).await;
    let spellings = [
        "0x7f.1",
        "2130706433",
        "017700000001",
        "127.1",
        "0177.0.0.1",
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
        "[::1]",
    ];
    for spelling in spellings {
        let mut c = client(&p).await;
        let (status, _, body) =
            roundtrip(&mut c, &format!("GET http://{spelling}:{port}/ HTTP/1.1\r\nHost: x\r\n\r\n")).await;
        assert_eq!(status, 403, "{spelling}: {body}");
        assert!(body.contains("loopback") && body.contains("never allowed"), "{spelling}: {body}");
        let (status, _, body) =
            roundtrip(&mut c, &format!("CONNECT {spelling}:{port} HTTP/1.1\r\nHost: x\r\n\r\n")).await;
        assert_eq!(status, 403, "{spelling}: {body}");
    }
    let mut c = client(&p).await;
    let (status, _, body) = roundtrip(&mut c, &format!("CONNECT localhost:{port} HTTP/1.1\r\nHost: x\r\n\r\n")).await;
    assert_eq!(status, 403, "localhost via the system resolver: {body}");
    let (status, _, body) = roundtrip(&mut c, "GET http://0.0.0.0/ HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(status, 403, "{body}");
    assert!(!got_connection(&target).await, "the proxy connected to loopback");
    let events = p.audit.wait_for(2 * spellings.len() + 2).await;
    assert!(events.iter().all(|e| e.decision == Decision::Refused), "{events:#?}");
    assert!(events.iter().take(2 * spellings.len()).all(|e| e.host == "127.0.0.1" || e.host == "::1"));
}

#[tokio::test]
async fn policy_changes_apply_live_and_deny_wins() {
    let (up, _) = http_upstream().await;
    let p = start_proxy(loopback_config(&[]), Policy::none(), None).await;
    let req = format!("GET http://allowed.test:{}/ HTTP/1.1\r\nHost: a\r\n\r\n", up.port());
    let mut c = client(&p).await;
    let (status, _, body) = roundtrip(&mut c, &req).await;
    assert_eq!(status, 403);
    assert!(body.contains("network mode is none"), "{body}");

    p.sandbox.set_policy(allowlist(&["*.test"]));
    let mut c = client(&p).await;
    assert_eq!(roundtrip(&mut c, &req).await.0, 200);

    let deny = vec!["allowed.test".to_owned()];
    p.sandbox.set_policy(Policy::compile(Mode::Allowlist, &["*.test".to_owned()], &deny).unwrap());
    let mut c = client(&p).await;
    let (status, _, body) = roundtrip(&mut c, &req).await;
    assert_eq!(status, 403);
    assert!(body.contains("matches deny pattern \"allowed.test\""), "{body}");
}

#[tokio::test]
async fn unreachable_upstream_is_a_502_and_audited_as_failed() {
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
    let p = start_proxy(loopback_config(&[]), allowlist(&["allowed.test"]), None).await;
    let mut c = client(&p).await;
    let (status, _, body) =
        roundtrip(&mut c, &format!("CONNECT allowed.test:{closed} HTTP/1.1\r\nHost: a\r\n\r\n")).await;
    assert_eq!(status, 502);
    assert!(body.starts_with(&format!("sandkasten egress: could not reach allowed.test:{closed}: upstream connect")));
    let events = p.audit.wait_for(1).await;
    assert_eq!(events[0].decision, Decision::Failed);
}

#[tokio::test]
async fn hostile_input_gets_errors_and_the_proxy_keeps_serving() {
    let (up, _) = http_upstream().await;
    let p = start_proxy(loopback_config(&[]), allowlist(&["allowed.test"]), None).await;

    let mut c = client(&p).await;
    let huge = format!("GET http://allowed.test/ HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(100 * 1024));
    let _ = c.write_all(huge.as_bytes()).await;
    let resp = read_message(&mut c).await.map(|(head, _)| head).unwrap_or_default();
    assert!(resp.starts_with("HTTP/1.1 431"), "oversized head: {resp}");

    for garbage in [
        "\x00\x01\x02garbage\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
        "CONNECT allowed.test HTTP/1.1\r\n\r\n",
        "GET http://b\u{fc}cher.test/ HTTP/1.1\r\n\r\n",
        "CONNECT [::1 HTTP/1.1\r\n\r\n",
    ] {
        let mut c = client(&p).await;
        let _ = c.write_all(garbage.as_bytes()).await;
        let resp = read_message(&mut c).await.map(|(head, _)| head).unwrap_or_default();
        assert!(resp.is_empty() || resp.starts_with("HTTP/1.1 4"), "{garbage:?}: {resp}");
    }
    let mut c = client(&p).await;
    let req = format!("GET http://allowed.test:{}/ HTTP/1.1\r\nHost: a\r\n\r\n", up.port());
    assert_eq!(roundtrip(&mut c, &req).await.0, 200, "still serving");
}

#[tokio::test]
async fn a_sandbox_cannot_hold_more_than_max_connections() {
    let echo = echo_upstream().await;
    let (up, _) = http_upstream().await;
    let cfg = EgressConfig { max_connections: 2, ..loopback_config(&[]) };
    let p = start_proxy(cfg, allowlist(&["allowed.test"]), None).await;
    let mut tunnels = Vec::new();
    for _ in 0..2 {
        let mut c = client(&p).await;
        let req = format!("CONNECT allowed.test:{} HTTP/1.1\r\nHost: a\r\n\r\n", echo.port());
        assert_eq!(roundtrip(&mut c, &req).await.0, 200);
        tunnels.push(c);
    }
    // The third connection waits in the backlog: its request gets no answer while both tunnels are open.
    let mut third = client(&p).await;
    let req = format!("GET http://allowed.test:{}/ HTTP/1.1\r\nHost: a\r\n\r\n", up.port());
    third.write_all(req.as_bytes()).await.unwrap();
    let mut byte = [0u8; 1];
    let early = tokio::time::timeout(std::time::Duration::from_millis(300), third.read(&mut byte)).await;
    assert!(early.is_err(), "served beyond max_connections");
    drop(tunnels.pop());
    let (head, body) = read_message(&mut third).await.expect("served once a slot is free");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body, b"hello");
}

#[tokio::test]
async fn sandboxes_together_cannot_hold_more_than_max_total_connections() {
    // Each sandbox may hold 2, all together 3: a few sandboxes cannot take every descriptor of the server.
    let echo = echo_upstream().await;
    let cfg = EgressConfig { max_connections: 2, max_total_connections: 3, ..loopback_config(&[]) };
    let proxy = sandkasten_egress::Proxy::new(cfg, Arc::new(MemAudit::default())).unwrap();
    let mut doors = Vec::new();
    let mut handles = Vec::new();
    for name in ["sb-a", "sb-b"] {
        let sandbox =
            Arc::new(sandkasten_egress::SandboxEgress::new(name, "tenant-a", allowlist(&["allowed.test"]), None));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        doors.push(listener.local_addr().unwrap());
        handles.push(proxy.serve(listener, sandbox));
    }
    let tunnel = |door| async move {
        let mut c = tokio::net::TcpStream::connect(door).await.unwrap();
        let req = format!("CONNECT allowed.test:{} HTTP/1.1\r\nHost: a\r\n\r\n", echo.port());
        c.write_all(req.as_bytes()).await.unwrap();
        c
    };
    let answered = |mut c: tokio::net::TcpStream| async move {
        let mut byte = [0u8; 1];
        let got = tokio::time::timeout(std::time::Duration::from_millis(400), c.read(&mut byte)).await;
        (got.is_ok(), c)
    };
    let (a1, first_a) = answered(tunnel(doors[0]).await).await;
    let (a2, second_a) = answered(tunnel(doors[0]).await).await;
    let (b1, _first_b) = answered(tunnel(doors[1]).await).await;
    assert!(a1 && a2 && b1, "three connections fit");
    // sb-b holds one of its two, but the proxy holds three of three: its second waits in its backlog.
    let (early, waiting) = answered(tunnel(doors[1]).await).await;
    assert!(!early, "served beyond max_total_connections");
    drop((first_a, second_a));
    let (late, _second_b) = answered(waiting).await;
    assert!(late, "served once another sandbox freed a slot");
}

#[tokio::test]
async fn one_tenants_sandboxes_cannot_take_the_slots_of_another() {
    // Each sandbox may hold 2, a tenant's sandboxes 3, all together 10: tenant a's third sandbox waits, tenant b's
    // is served at once.
    let echo = echo_upstream().await;
    let cfg = EgressConfig {
        max_connections: 2,
        max_tenant_connections: 3,
        max_total_connections: 10,
        ..loopback_config(&[])
    };
    let proxy = sandkasten_egress::Proxy::new(cfg, Arc::new(MemAudit::default())).unwrap();
    let mut doors = Vec::new();
    let mut handles = Vec::new();
    for (name, tenant) in [("sb-a1", "a"), ("sb-a2", "a"), ("sb-b1", "b")] {
        let policy = allowlist(&["allowed.test"]);
        let sandbox = Arc::new(sandkasten_egress::SandboxEgress::new(name, tenant, policy, None));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        doors.push(listener.local_addr().unwrap());
        handles.push(proxy.serve(listener, sandbox));
    }
    let answered = |door| async move {
        let mut c = tokio::net::TcpStream::connect(door).await.unwrap();
        let req = format!("CONNECT allowed.test:{} HTTP/1.1\r\nHost: a\r\n\r\n", echo.port());
        c.write_all(req.as_bytes()).await.unwrap();
        let mut byte = [0u8; 1];
        let got = tokio::time::timeout(std::time::Duration::from_millis(400), c.read(&mut byte)).await;
        (got.is_ok(), c)
    };
    let (a1, _first) = answered(doors[0]).await;
    let (a2, _second) = answered(doors[0]).await;
    let (a3, _third) = answered(doors[1]).await;
    assert!(a1 && a2 && a3, "tenant a's three fit");
    let (a4, _fourth) = answered(doors[1]).await;
    assert!(!a4, "tenant a got more than max_tenant_connections");
    let (b1, _other) = answered(doors[2]).await;
    assert!(b1, "tenant b is served while tenant a waits");
}

#[tokio::test]
async fn idle_tunnels_and_idle_client_connections_are_closed() {
    // A sandbox holding connections open without traffic must not keep host sockets (and its connection slots)
    // forever: after idle_timeout_ms both a quiet tunnel and a quiet keep-alive connection are closed.
    let echo = echo_upstream().await;
    let config = EgressConfig { idle_timeout_ms: 300, ..loopback_config(&[]) };
    let p = start_proxy(config, allowlist(&["allowed.test"]), None).await;
    let mut tunnel = client(&p).await;
    let req = format!("CONNECT allowed.test:{0} HTTP/1.1\r\nHost: allowed.test:{0}\r\n\r\n", echo.port());
    assert_eq!(roundtrip(&mut tunnel, &req).await.0, 200);
    tunnel.write_all(b"x").await.unwrap();
    let mut one = [0u8; 1];
    tunnel.read_exact(&mut one).await.unwrap();
    let mut quiet = client(&p).await;
    let refused = "GET http://unlisted.test/ HTTP/1.1\r\nHost: unlisted.test\r\n\r\n";
    assert_eq!(roundtrip(&mut quiet, refused).await.0, 403);
    for (name, stream) in [("tunnel", &mut tunnel), ("keep-alive connection", &mut quiet)] {
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(std::time::Duration::from_secs(10), stream.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "the idle {name} was not closed");
    }
    let events = p.audit.wait_for(2).await;
    assert!(events.iter().any(|e| e.decision == Decision::Allowed && e.bytes_up == 1), "{events:#?}");
}

#[tokio::test]
async fn a_denied_address_is_refused_under_any_name_that_resolves_to_it() {
    let (up, received) = http_upstream().await;
    let policy = Policy::compile(Mode::Open, &[], &["127.0.0.1".to_owned()]).unwrap();
    let p = start_proxy(loopback_config(&[]), policy, None).await;
    let mut c = client(&p).await;
    // allowed.test resolves (static entry) to 127.0.0.1, which the deny list names as an address.
    let request = format!("GET http://allowed.test:{}/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n", up.port());
    let (status, _, body) = roundtrip(&mut c, &request).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("matches deny pattern \"127.0.0.1\""), "{body}");
    assert!(received.lock().unwrap().is_empty(), "the upstream was reached");
    // Positive control: without the deny pattern the same request goes through.
    let open = Policy::compile(Mode::Open, &[], &[]).unwrap();
    let p = start_proxy(loopback_config(&[]), open, None).await;
    let mut c = client(&p).await;
    assert_eq!(roundtrip(&mut c, &request).await.0, 200);
}
