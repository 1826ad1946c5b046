//! Secrets reach only their hosts (asserted by the upstream servers), over plain HTTP and through TLS
//! interception with a per-sandbox CA; CONNECTs without a secret stay blind; dropping the handle closes the
//! listener and open tunnels. Loopback only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use rustls::pki_types::ServerName;
use sandkasten_egress::{Decision, EgressConfig, SandboxCa, Secret};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

const PLACEHOLDER: &str = "SANDKASTEN_SECRET_PLACEHOLDER_gh";
const REAL: &str = "ghp_real_value_never_in_sandbox";

fn secret_for(hosts: &[&str]) -> Secret {
    Secret {
        name: "gh".into(),
        value: REAL.into(),
        placeholder: PLACEHOLDER.into(),
        hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
        header: None,
    }
}

/// A sandbox CA for the secrets' host, as the server makes one.
/// The loopback config, trusting `up`'s test CA for upstream TLS.
fn trusting(up: &TlsUpstream) -> EgressConfig {
    EgressConfig { upstream_ca_file: Some(up.ca_file.clone()), ..loopback_config(&[]) }
}

fn sandbox_ca() -> SandboxCa {
    SandboxCa::generate("sb-test", &["allowed.test".to_owned()]).unwrap()
}

#[tokio::test]
async fn plain_http_secret_is_substituted_in_headers_only_toward_its_host() {
    let (good, good_rx) = http_upstream().await;
    let (other, other_rx) = http_upstream().await;
    let p = start_proxy(loopback_config(&[]), allowlist(&["allowed.test", "other.test"]), None).await;
    // Plain HTTP carries the value only to a port the pattern names.
    let on_port = format!("allowed.test:{}", good.port());
    p.sandbox.set_secrets(vec![secret_for(&[&on_port])]).unwrap();
    for (port, host) in [(good.port(), "allowed.test"), (other.port(), "other.test")] {
        let mut c = client(&p).await;
        let body = format!("token={PLACEHOLDER}");
        let req = format!(
            "POST http://{host}:{port}/api HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {PLACEHOLDER}\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        assert_eq!(roundtrip(&mut c, &req).await.0, 200);
    }
    let (head, body) = good_rx.lock().unwrap()[0].clone();
    assert!(head.contains(&format!("authorization: Bearer {REAL}\r\n")), "{head}");
    assert!(!head.contains(PLACEHOLDER), "{head}");
    assert_eq!(String::from_utf8(body).unwrap(), format!("token={PLACEHOLDER}"), "bodies are never touched");
    let (head, body) = other_rx.lock().unwrap()[0].clone();
    assert!(head.contains(&format!("authorization: Bearer {PLACEHOLDER}\r\n")), "{head}");
    assert!(!head.contains(REAL) && !String::from_utf8_lossy(&body).contains(REAL), "real value leaked: {head}");
}

#[tokio::test]
async fn tls_interception_delivers_the_secret_to_its_host_only() {
    let up = tls_upstream().await;
    let cfg = trusting(&up);
    let ca = sandbox_ca();
    let sandbox_ca_pem = ca.cert_pem();
    let p = start_proxy(cfg, allowlist(&["allowed.test"]), Some(ca)).await;
    p.sandbox.set_secrets(vec![secret_for(&["allowed.test"])]).unwrap();

    // The sandbox trusts only its own CA: the handshake succeeding proves the proxy presented a leaf from it.
    let c = tunnel(&p, "allowed.test", up.addr.port()).await;
    let name = ServerName::try_from("allowed.test").unwrap();
    let mut tls = TlsConnector::from(client_config(&sandbox_ca_pem)).connect(name, c).await.unwrap();
    // A forged inner Host must not redirect the secret anywhere else.
    let req = format!("GET /user HTTP/1.1\r\nHost: evil.test\r\nAuthorization: token {PLACEHOLDER}\r\n\r\n");
    let (status, _, body) = roundtrip(&mut tls, &req).await;
    assert_eq!((status, body.as_str()), (200, "hello"));
    // A second request on the same intercepted connection takes a new upstream connection.
    let (status, _, _) = roundtrip(&mut tls, "GET /again HTTP/1.1\r\nHost: allowed.test\r\n\r\n").await;
    assert_eq!(status, 200);
    drop(tls);

    let received = up.received.lock().unwrap().clone();
    assert_eq!(received.len(), 2);
    let head = &received[0].0;
    assert!(head.starts_with("GET /user HTTP/1.1\r\n"), "{head}");
    assert!(head.contains(&format!("authorization: token {REAL}\r\n")), "{head}");
    assert!(head.contains(&format!("host: allowed.test:{}\r\n", up.addr.port())), "{head}");
    let events = p.audit.wait_for(1).await;
    assert_eq!(events[0].decision, Decision::Allowed);
    assert!(events[0].bytes_up > 0 && events[0].bytes_down > 0, "{:?}", events[0]);
}

#[tokio::test]
async fn connect_without_a_matching_secret_is_a_blind_tunnel() {
    let up = tls_upstream().await;
    let cfg = trusting(&up);
    let p = start_proxy(cfg, allowlist(&["allowed.test", "other.test"]), Some(sandbox_ca())).await;
    p.sandbox.set_secrets(vec![secret_for(&["allowed.test"])]).unwrap();
    // Trusting only the upstream's own CA works end to end: nothing in between re-signed the connection.
    let c = tunnel(&p, "other.test", up.addr.port()).await;
    let name = ServerName::try_from("other.test").unwrap();
    let mut tls = TlsConnector::from(client_config(&up.ca_pem)).connect(name, c).await.unwrap();
    let req = format!("GET / HTTP/1.1\r\nHost: other.test\r\nAuthorization: token {PLACEHOLDER}\r\n\r\n");
    assert_eq!(roundtrip(&mut tls, &req).await.0, 200);
    let head = up.received.lock().unwrap()[0].0.clone();
    assert!(head.contains(PLACEHOLDER) && !head.contains(REAL), "{head}");
}

#[tokio::test]
async fn interception_refuses_an_upstream_the_roots_do_not_trust() {
    let up = tls_upstream().await;
    // No upstream_ca_file: the upstream's test CA is unknown, so the secret must not be sent.
    let p = start_proxy(loopback_config(&[]), allowlist(&["allowed.test"]), Some(sandbox_ca())).await;
    let sandbox_ca_pem = p.sandbox.ca().unwrap().cert_pem();
    p.sandbox.set_secrets(vec![secret_for(&["allowed.test"])]).unwrap();
    let c = tunnel(&p, "allowed.test", up.addr.port()).await;
    let name = ServerName::try_from("allowed.test").unwrap();
    let mut tls = TlsConnector::from(client_config(&sandbox_ca_pem)).connect(name, c).await.unwrap();
    let req = format!("GET / HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: token {PLACEHOLDER}\r\n\r\n");
    let (status, _, body) = roundtrip(&mut tls, &req).await;
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("upstream TLS"), "{body}");
    assert!(up.received.lock().unwrap().is_empty(), "the secret reached an unverified upstream");
}

#[tokio::test]
async fn dropping_the_handle_closes_the_listener_and_open_tunnels() {
    let echo = echo_upstream().await;
    let mut p = start_proxy(loopback_config(&[]), allowlist(&["allowed.test"]), None).await;
    let mut t = tunnel(&p, "allowed.test", echo.port()).await;
    t.write_all(b"x").await.unwrap();
    let mut one = [0u8; 1];
    t.read_exact(&mut one).await.unwrap();

    drop(p.handle.take());
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), t.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "the open tunnel was not closed");
    let mut refused = false;
    for _ in 0..100 {
        if TcpStream::connect(p.addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(refused, "the listener still accepts after the handle was dropped");
    let events = p.audit.wait_for(1).await;
    assert_eq!((events[0].bytes_up, events[0].bytes_down), (1, 1), "audit recorded when the tunnel was closed");
}

#[tokio::test]
async fn shutdown_waits_until_every_connection_is_closed() {
    let echo = echo_upstream().await;
    let mut p = start_proxy(loopback_config(&[]), allowlist(&["allowed.test"]), None).await;
    let mut t = tunnel(&p, "allowed.test", echo.port()).await;
    tokio::time::timeout(Duration::from_secs(5), p.handle.take().unwrap().shutdown()).await.unwrap();
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_millis(500), t.read_to_end(&mut rest)).await.unwrap();
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    assert!(TcpStream::connect(p.addr).await.is_err());
    assert_eq!(p.audit.events.lock().unwrap().len(), 1, "audit recorded by the time shutdown returns");
}

#[tokio::test]
async fn placeholders_cannot_blow_up_the_head_sent_upstream() {
    // A head within the client limit, full of placeholders, would grow past it once every placeholder became the
    // (much longer) value: the proxy would build and send megabytes per request. It refuses with 431 instead.
    let (good, good_rx) = http_upstream().await;
    let p = start_proxy(loopback_config(&[]), allowlist(&["allowed.test"]), None).await;
    let mut long = secret_for(&[&format!("allowed.test:{}", good.port())]);
    long.value = "v".repeat(4096);
    p.sandbox.set_secrets(vec![long]).unwrap();
    let many = [PLACEHOLDER; 400].join(",");
    assert!(many.len() < sandkasten_egress::MAX_HEAD_BYTES / 2, "the client's head itself is acceptable");
    let mut c = client(&p).await;
    let req =
        format!("GET http://allowed.test:{}/ HTTP/1.1\r\nHost: allowed.test\r\nX-Many: {many}\r\n\r\n", good.port());
    let (status, _, body) = roundtrip(&mut c, &req).await;
    assert_eq!(status, 431, "{body}");
    assert!(body.contains("secret"), "{body}");
    assert!(good_rx.lock().unwrap().is_empty(), "the inflated head was sent upstream");
    // One placeholder in an ordinary header still goes through on the same connection.
    let req = format!(
        "GET http://allowed.test:{}/ HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: Bearer {PLACEHOLDER}\r\n\r\n",
        good.port()
    );
    assert_eq!(roundtrip(&mut c, &req).await.0, 200);
    assert!(good_rx.lock().unwrap()[0].0.contains(&"v".repeat(4096)));
}

#[tokio::test]
async fn an_intercepted_tunnel_follows_a_policy_change_on_its_next_request() {
    // Each request inside an intercepted tunnel opens a new upstream connection (with the secret in it). After the
    // host is taken off the allowlist, those new connections must stop, like every other new connection.
    let up = tls_upstream().await;
    let cfg = trusting(&up);
    let ca = sandbox_ca();
    let sandbox_ca_pem = ca.cert_pem();
    let p = start_proxy(cfg, allowlist(&["allowed.test", "other.test"]), Some(ca)).await;
    p.sandbox.set_secrets(vec![secret_for(&["allowed.test"])]).unwrap();
    let c = tunnel(&p, "allowed.test", up.addr.port()).await;
    let name = ServerName::try_from("allowed.test").unwrap();
    let mut tls = TlsConnector::from(client_config(&sandbox_ca_pem)).connect(name, c).await.unwrap();
    let req = format!("GET /one HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: token {PLACEHOLDER}\r\n\r\n");
    assert_eq!(roundtrip(&mut tls, &req).await.0, 200);

    p.sandbox.set_policy(allowlist(&["other.test"]));
    let req = format!("GET /two HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: token {PLACEHOLDER}\r\n\r\n");
    let (status, _, body) = roundtrip(&mut tls, &req).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("not in the allowlist"), "{body}");
    let received = up.received.lock().unwrap().clone();
    assert_eq!(received.len(), 1, "a new upstream connection was made after the policy refused the host");
    let events = p.audit.wait_for(1).await;
    assert!(
        events.iter().any(|e| e.decision == Decision::Refused && e.host == "allowed.test"),
        "the refusal is audited: {events:#?}"
    );
}

#[tokio::test]
async fn a_placeholder_in_the_host_name_is_never_replaced() {
    // Placeholders are lowercase letters, digits and '-': a valid DNS label. Under a wildcard secret host, a request to
    // `<placeholder>.allowed.test` put the placeholder in the Host header the proxy writes, where it was replaced by
    // the value; servers reflect Host everywhere (redirects to https://<Host>/, error pages), handing it back.
    let placeholder = "sandkasten-secret-gh-0123456789abcdef";
    let named = format!("{placeholder}.allowed.test");
    let (good, good_rx) = http_upstream().await;
    let p = start_proxy(loopback_config(&[(&named, "127.0.0.1")]), allowlist(&["*.allowed.test"]), None).await;
    let mut secret = secret_for(&[&format!("*.allowed.test:{}", good.port())]);
    secret.placeholder = placeholder.to_owned();
    p.sandbox.set_secrets(vec![secret]).unwrap();
    let mut c = client(&p).await;
    let req = format!(
        "GET http://{named}:{0}/ HTTP/1.1\r\nHost: {named}\r\nAuthorization: Bearer {placeholder}\r\n\r\n",
        good.port()
    );
    assert_eq!(roundtrip(&mut c, &req).await.0, 200);
    let head = good_rx.lock().unwrap()[0].0.clone();
    assert!(head.contains(&format!("authorization: Bearer {REAL}\r\n")), "positive control: {head}");
    assert!(head.contains(&format!("host: {named}:{}\r\n", good.port())), "the Host header was rewritten: {head}");
}

#[tokio::test]
async fn a_secret_without_a_port_never_travels_over_plain_http() {
    // Plain HTTP is readable by anyone on the path: a pattern without a port (or with :443) lets the value out over
    // intercepted TLS only. The same host over TLS gets it; naming the plain port lets plain HTTP have it.
    let (plain, plain_rx) = http_upstream().await;
    let up = tls_upstream().await;
    let cfg = trusting(&up);
    let ca = sandbox_ca();
    let sandbox_ca_pem = ca.cert_pem();
    let p = start_proxy(cfg, allowlist(&["allowed.test"]), Some(ca)).await;
    p.sandbox.set_secrets(vec![secret_for(&["allowed.test"])]).unwrap();
    let plain_request = format!(
        "GET http://allowed.test:{}/plain HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: Bearer {PLACEHOLDER}\r\n\r\n",
        plain.port()
    );
    let mut c = client(&p).await;
    assert_eq!(roundtrip(&mut c, &plain_request).await.0, 200);
    let head = plain_rx.lock().unwrap()[0].0.clone();
    assert!(head.contains(&format!("authorization: Bearer {PLACEHOLDER}\r\n")), "{head}");
    assert!(!head.contains(REAL), "the value went out in plain HTTP: {head}");

    let t = tunnel(&p, "allowed.test", up.addr.port()).await;
    let name = ServerName::try_from("allowed.test").unwrap();
    let mut tls = TlsConnector::from(client_config(&sandbox_ca_pem)).connect(name, t).await.unwrap();
    let req = format!("GET /tls HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: Bearer {PLACEHOLDER}\r\n\r\n");
    assert_eq!(roundtrip(&mut tls, &req).await.0, 200);
    let head = up.received.lock().unwrap()[0].0.clone();
    assert!(head.contains(&format!("authorization: Bearer {REAL}\r\n")), "positive control over TLS: {head}");

    p.sandbox.set_secrets(vec![secret_for(&["allowed.test", &format!("allowed.test:{}", plain.port())])]).unwrap();
    assert_eq!(roundtrip(&mut c, &plain_request).await.0, 200);
    let head = plain_rx.lock().unwrap()[1].0.clone();
    assert!(head.contains(&format!("authorization: Bearer {REAL}\r\n")), "the named plain port: {head}");
}

#[tokio::test]
async fn a_secret_host_outside_the_cas_constraints_gets_a_blind_tunnel() {
    // The CA was made for allowed.test; a secret later bound to other.test as well cannot be intercepted for it
    // (no leaf the sandbox's clients would accept): the tunnel stays blind and the value stays home.
    let up = tls_upstream().await;
    let cfg = trusting(&up);
    let p = start_proxy(cfg, allowlist(&["allowed.test", "other.test"]), Some(sandbox_ca())).await;
    p.sandbox.set_secrets(vec![secret_for(&["allowed.test", "other.test"])]).unwrap();
    let c = tunnel(&p, "other.test", up.addr.port()).await;
    let name = ServerName::try_from("other.test").unwrap();
    let mut tls = TlsConnector::from(client_config(&up.ca_pem)).connect(name, c).await.unwrap();
    let req = format!("GET / HTTP/1.1\r\nHost: other.test\r\nAuthorization: token {PLACEHOLDER}\r\n\r\n");
    assert_eq!(roundtrip(&mut tls, &req).await.0, 200);
    let head = up.received.lock().unwrap()[0].0.clone();
    assert!(head.contains(PLACEHOLDER) && !head.contains(REAL), "{head}");
}
