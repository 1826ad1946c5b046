//! A blind tunnel carries only what its CONNECT was allowed for: a ClientHello naming another host (allowed or not),
//! one without a server name toward a name, plain bytes on port 443, and a ClientHello too large or too slow are
//! refused before the upstream sees a byte, which the upstream's own record shows; a matching ClientHello, plain
//! bytes elsewhere and protocols whose server speaks first work as before. Loopback only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, RootCertStore};
use sandkasten_egress::{AuditEvent, Decision, EgressConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;

/// The TLS alert a refused ClientHello gets: fatal, access_denied.
const ACCESS_DENIED: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31];

/// The raw ClientHello a rustls client sends for `name`, with or without SNI.
fn client_hello(name: &str, sni: bool) -> Vec<u8> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(RootCertStore::empty())
        .with_no_client_auth();
    config.enable_sni = sni;
    let mut conn = ClientConnection::new(Arc::new(config), ServerName::try_from(name.to_owned()).unwrap()).unwrap();
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).unwrap();
    }
    out
}

/// Everything the proxy sends back until it closes the tunnel (bounded).
async fn rest_of(mut tunnel: TcpStream) -> Vec<u8> {
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), tunnel.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the proxy kept the tunnel open");
    rest
}

/// The attempt's final audit record, and its opening one.
async fn final_and_opening(p: &TestProxy) -> (AuditEvent, AuditEvent) {
    let events = p.audit.wait_for(1).await;
    let opened = p.audit.opened.lock().unwrap().clone();
    assert_eq!(opened.len(), 1, "{opened:#?}");
    (events[0].clone(), opened[0].clone())
}

#[tokio::test]
async fn a_client_hello_for_another_host_is_refused_before_the_upstream_sees_a_byte() {
    // other.test is allowed too, and resolves to the same address (a shared front end): still refused, since the
    // front end would route the allowed.test tunnel to other.test's site.
    let (up, recorded) = recording_upstream().await;
    let p = start_proxy(loopback_config(&[]), allowlist(&["allowed.test", "other.test"]), None).await;
    let mut t = tunnel(&p, "allowed.test", up.port()).await;
    t.write_all(&client_hello("other.test", true)).await.unwrap();
    assert_eq!(rest_of(t).await, ACCESS_DENIED, "the client is told why");
    assert_eq!(closed_connections(&recorded).await, [Vec::<u8>::new()], "the upstream received bytes");
    let (last, opened) = final_and_opening(&p).await;
    assert_eq!(opened.decision, Decision::Allowed);
    assert_eq!(last.connection, opened.connection, "one attempt, recorded when it opened and when refused");
    assert_eq!(last.decision, Decision::Refused);
    assert_eq!(last.rule, "sni_mismatch: the TLS server name \"other.test\" is not the CONNECT host allowed.test");
    assert_eq!(last.bytes_up, 0);
}

#[tokio::test]
async fn a_client_hello_for_the_connect_host_goes_through() {
    let up = tls_upstream().await;
    let mut cfg = loopback_config(&[]);
    cfg.upstream_ca_file = Some(up.ca_file.clone());
    let p = start_proxy(cfg, allowlist(&["allowed.test"]), None).await;
    let t = tunnel(&p, "Allowed.Test.", up.addr.port()).await;
    let name = ServerName::try_from("allowed.test").unwrap();
    let mut tls = TlsConnector::from(client_config(&up.ca_pem)).connect(name, t).await.unwrap();
    assert_eq!(roundtrip(&mut tls, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n").await.0, 200);
    assert_eq!(up.received.lock().unwrap().len(), 1);
    drop(tls);
    let (last, _) = final_and_opening(&p).await;
    assert_eq!(last.decision, Decision::Allowed, "{last:?}");
}

#[tokio::test]
async fn a_client_hello_without_a_server_name_passes_toward_an_address_only() {
    let (up, recorded) = recording_upstream().await;
    let p = start_proxy(loopback_config(&[]), allowlist(&["allowed.test", "127.0.0.1"]), None).await;
    let mut t = tunnel(&p, "allowed.test", up.port()).await;
    t.write_all(&client_hello("allowed.test", false)).await.unwrap();
    assert_eq!(rest_of(t).await, ACCESS_DENIED);
    assert_eq!(closed_connections(&recorded).await, [Vec::<u8>::new()]);
    let (last, _) = final_and_opening(&p).await;
    assert!(last.rule.starts_with("sni_missing: "), "{last:?}");

    // Toward an address a client sends no SNI (rustls does not for an IP): the hello goes to the upstream whole.
    let hello = client_hello("127.0.0.1", true);
    let mut t = tunnel(&p, "127.0.0.1", up.port()).await;
    t.write_all(&hello).await.unwrap();
    for _ in 0..200 {
        if recorded.lock().unwrap().get(1).is_some_and(|(bytes, _)| bytes.len() == hello.len()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(recorded.lock().unwrap()[1].0, hello);
    drop(t);
}

/// A listener on port 443 of a loopback address of its own (127.0.44.x), named `tls-port.test`.
async fn listener_on_443() -> (TcpListener, String) {
    for last in 10..250u8 {
        let addr = format!("127.0.44.{last}");
        if let Ok(listener) = TcpListener::bind((addr.as_str(), 443)).await {
            return (listener, addr);
        }
    }
    panic!("no loopback address with port 443 free");
}

#[tokio::test]
async fn plain_bytes_are_refused_on_port_443_and_pass_elsewhere() {
    let (listener, addr) = listener_on_443().await;
    let recorded = record_on(listener);
    let mut cfg = loopback_config(&[("tls-port.test", &addr)]);
    cfg.allow_cidrs.push(format!("{addr}/32"));
    let p = start_proxy(cfg, allowlist(&["tls-port.test", "allowed.test"]), None).await;
    let mut t = tunnel(&p, "tls-port.test", 443).await;
    t.write_all(b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n").await.unwrap();
    assert_eq!(rest_of(t).await, b"", "closed without a TLS alert: the client spoke no TLS");
    assert_eq!(closed_connections(&recorded).await, [Vec::<u8>::new()]);
    let (last, _) = final_and_opening(&p).await;
    assert_eq!(last.rule, "not_tls: a CONNECT to port 443 carries TLS only");

    let echo = echo_upstream().await;
    let mut t = tunnel(&p, "allowed.test", echo.port()).await;
    t.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let mut back = [0u8; 18];
    t.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"GET / HTTP/1.1\r\n\r\n");
}

#[tokio::test]
async fn an_oversized_or_slow_client_hello_is_refused_and_nothing_reaches_the_upstream() {
    let (up, recorded) = recording_upstream().await;
    let config = EgressConfig { connect_timeout_ms: 300, ..loopback_config(&[]) };
    let p = start_proxy(config, allowlist(&["allowed.test"]), None).await;
    // A record announcing 16 KiB and a ClientHello announcing 64 KiB: rustls would wait for all of it.
    let mut t = tunnel(&p, "allowed.test", up.port()).await;
    t.write_all(&[0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0x00, 0xff, 0xff]).await.unwrap();
    let _ = t.write_all(&vec![0u8; 20 * 1024]).await;
    assert_eq!(rest_of(t).await, ACCESS_DENIED);
    let events = p.audit.wait_for(1).await;
    assert!(events[0].rule.starts_with("client_hello_too_large: "), "{:?}", events[0]);

    // Five bytes of a ClientHello, then silence: refused when connect_timeout_ms is up.
    let mut t = tunnel(&p, "allowed.test", up.port()).await;
    let start = Instant::now();
    t.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00]).await.unwrap();
    assert_eq!(rest_of(t).await, ACCESS_DENIED);
    assert!(start.elapsed() >= Duration::from_millis(300), "{:?}", start.elapsed());
    let events = p.audit.wait_for(2).await;
    assert!(events[1].rule.starts_with("client_hello_timeout: "), "{:?}", events[1]);
    assert_eq!(closed_connections(&recorded).await, [Vec::<u8>::new(), Vec::new()]);
}

#[tokio::test]
async fn a_server_that_speaks_first_is_heard_before_the_client_says_anything() {
    // SSH, SMTP and friends: the client waits for the server's banner. The opening must not hold it back.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        stream.write_all(b"SSH-2.0-upstream\r\n").await.unwrap();
        let mut line = [0u8; 16];
        stream.read_exact(&mut line).await.unwrap();
        stream.write_all(&line).await.unwrap();
    });
    let p = start_proxy(loopback_config(&[]), allowlist(&["allowed.test"]), None).await;
    let mut t = tunnel(&p, "allowed.test", port).await;
    let mut banner = [0u8; 18];
    tokio::time::timeout(Duration::from_secs(5), t.read_exact(&mut banner)).await.unwrap().unwrap();
    assert_eq!(&banner, b"SSH-2.0-upstream\r\n");
    t.write_all(b"SSH-2.0-client\r\n").await.unwrap();
    let mut echoed = [0u8; 16];
    t.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"SSH-2.0-client\r\n");
}
