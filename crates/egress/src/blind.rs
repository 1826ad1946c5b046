//! A blind CONNECT tunnel (no secret applies): no byte of the client's reaches the upstream until its opening is
//! judged, then the two are spliced byte for byte.
//!
//! **The opening.** The policy allowed the CONNECT host, not whatever the bytes inside ask for. A front end shared by
//! many sites (a CDN, a cloud load balancer) picks the site by the ClientHello's server name (SNI), so a tunnel to an
//! allowed name carrying a ClientHello for another name would reach that other site. So:
//! - a TLS ClientHello must carry the CONNECT host as its server name (compared in canonical form: case and a trailing
//!   dot do not matter), even when the other name is allowed too: open another tunnel for it;
//! - a ClientHello without a server name is refused when the CONNECT host is a name (the front end would pick its
//!   default site, which need not be that name), and goes through when it is an IP address (clients send no SNI to an
//!   address);
//! - bytes that are not TLS are refused on port 443 (only TLS is spoken there, and a front end could route plain
//!   HTTP by its `Host`), and go through on every other port, as any TCP protocol may (`Host` routing there is the
//!   known gap of shared front ends, see the threat model);
//! - a ClientHello that rustls cannot parse (encrypted ClientHello included: its outer name is the front end's) is
//!   refused.
//!
//! A refusal closes the tunnel (after a TLS `access_denied` alert when the client spoke TLS) and is audited: the
//! attempt's record, opened as allowed, ends as refused with a rule naming the reason (`sni_mismatch: ...`).
//!
//! **Bounds.** At most [`MAX_HELLO_BYTES`] are buffered, and the ClientHello must be complete within
//! `connect_timeout_ms` (10 s by default, as for an intercepted tunnel's handshake): on port 443 from the start, on other
//! ports from the client's first byte. Meanwhile whatever the upstream sends flows back, since some protocols (SSH,
//! SMTP) speak first and their client says nothing until then; such a tunnel is bounded by the idle timeout as any.

use std::time::Duration;

use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::decide::Go;
use crate::hello::{HelloReader, MAX_HELLO_BYTES, Opening};
use crate::host::{Host, canonicalize_host};
use crate::io::idle_watchdog;
use crate::proxy::Ctx;

/// Copy buffer per direction of a blind tunnel: tokio's default (8 KiB) costs about twice the CPU per byte (measured
/// by `examples/egress_bench`).
const TUNNEL_BUFFER: usize = 64 * 1024;
/// The port that carries TLS only.
const TLS_PORT: u16 = 443;
/// A TLS alert record: fatal, `access_denied` (so a client reports a refusal, not a broken connection).
const ACCESS_DENIED_ALERT: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31];

/// Why a blind tunnel was closed at its opening, as its audit rule says it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum OpeningRefusal {
    /// The ClientHello names another host.
    #[error("sni_mismatch: the TLS server name {sni:?} is not the CONNECT host {host}")]
    SniMismatch {
        /// The server name the client sent.
        sni: String,
        /// The CONNECT host, canonical.
        host: String,
    },
    /// A ClientHello without a server name through a tunnel to a name.
    #[error("sni_missing: a TLS ClientHello through a CONNECT to a name must carry that name as its server name")]
    SniMissing,
    /// Plain bytes on the TLS port.
    #[error("not_tls: a CONNECT to port 443 carries TLS only")]
    NotTls,
    /// A TLS record that is no ClientHello rustls accepts.
    #[error("bad_client_hello: {0}")]
    BadHello(String),
    /// The ClientHello outgrew the buffer.
    #[error("client_hello_too_large: no complete ClientHello within {MAX_HELLO_BYTES} bytes")]
    TooLarge,
    /// The ClientHello was not complete in time.
    #[error("client_hello_timeout: no complete ClientHello within {0} ms")]
    Timeout(u128),
}

/// How a tunnel's opening ended.
enum Judged {
    /// Allowed: these bytes (the opening, possibly none) go to the upstream first, then the splice.
    Forward(Vec<u8>),
    /// Refused: close.
    Refuse(OpeningRefusal),
    /// A side closed (or failed) before the opening was complete: nothing to do.
    Closed,
}

/// Judges the opening, then splices the client and upstream until both sides close or the tunnel idles.
pub(crate) async fn run(ctx: Ctx, mut client: TokioIo<Upgraded>, go: Go) {
    let Go { host, port, mut upstream, counters, mut guard, .. } = go;
    let work = async {
        match open(&mut client, &mut upstream, &host, port, ctx.inner.connect_timeout).await {
            Judged::Forward(first) => {
                if upstream.write_all(&first).await.is_ok() {
                    let _ = tokio::io::copy_bidirectional_with_sizes(
                        &mut client,
                        &mut upstream,
                        TUNNEL_BUFFER,
                        TUNNEL_BUFFER,
                    )
                    .await;
                }
            }
            Judged::Refuse(refusal) => {
                tracing::info!(sandbox = %ctx.sandbox.sandbox_id, %host, port, %refusal, "egress tunnel refused");
                if refusal != OpeningRefusal::NotTls {
                    let _ = client.write_all(&ACCESS_DENIED_ALERT).await;
                }
                let _ = client.shutdown().await;
                guard.refuse(refusal.to_string());
            }
            Judged::Closed => {}
        }
    };
    tokio::select! {
        () = work => {}
        () = idle_watchdog(vec![counters], ctx.inner.idle_timeout) => {}
    }
    drop(guard);
}

/// Reads the client's opening (passing on what the upstream says meanwhile) and judges it.
async fn open<C, U>(client: &mut C, upstream: &mut U, host: &Host, port: u16, timeout: Duration) -> Judged
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + Unpin,
{
    let mut reader = HelloReader::new();
    let mut deadline = (port == TLS_PORT).then(|| Instant::now() + timeout);
    let mut from_client = [0u8; 4096];
    let mut from_upstream = vec![0u8; TUNNEL_BUFFER];
    loop {
        let due = async move {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            read = client.read(&mut from_client) => {
                let Ok(n) = read else { return Judged::Closed };
                if n == 0 {
                    // Closed before a byte (a half-close): the splice passes that on. Mid-ClientHello: nothing to send.
                    return if reader.is_empty() { Judged::Forward(Vec::new()) } else { Judged::Closed };
                }
                deadline.get_or_insert_with(|| Instant::now() + timeout);
                if let Some(opening) = reader.push(&from_client[..n]) {
                    return match judge(&opening, host, port) {
                        Ok(()) => Judged::Forward(reader.into_bytes()),
                        Err(refusal) => Judged::Refuse(refusal),
                    };
                }
            }
            read = upstream.read(&mut from_upstream) => {
                let n = match read {
                    Ok(0) | Err(_) => return Judged::Closed,
                    Ok(n) => n,
                };
                if client.write_all(&from_upstream[..n]).await.is_err() {
                    return Judged::Closed;
                }
            }
            () = due => return Judged::Refuse(OpeningRefusal::Timeout(timeout.as_millis())),
        }
    }
}

/// The rules of the module doc, for a tunnel to `host:port` that opened with `opening`.
fn judge(opening: &Opening, host: &Host, port: u16) -> Result<(), OpeningRefusal> {
    match opening {
        Opening::Tls { server_name: Some(sni) } => {
            if canonicalize_host(sni).is_ok_and(|named| &named == host) {
                Ok(())
            } else {
                Err(OpeningRefusal::SniMismatch { sni: sni.chars().take(255).collect(), host: host.audit_string() })
            }
        }
        Opening::Tls { server_name: None } => match host {
            Host::Name(_) => Err(OpeningRefusal::SniMissing),
            Host::Ip(_) => Ok(()),
        },
        Opening::NotTls if port == TLS_PORT => Err(OpeningRefusal::NotTls),
        Opening::NotTls => Ok(()),
        Opening::BadHello(why) => Err(OpeningRefusal::BadHello(why.clone())),
        Opening::TooLarge => Err(OpeningRefusal::TooLarge),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn name(n: &str) -> Host {
        canonicalize_host(n).unwrap()
    }

    fn tls(sni: Option<&str>) -> Opening {
        Opening::Tls { server_name: sni.map(str::to_owned) }
    }

    #[test]
    fn the_server_name_must_be_the_connect_host_in_canonical_form() {
        let host = name("Allowed.Test.");
        assert_eq!(judge(&tls(Some("allowed.test")), &host, 443), Ok(()));
        assert_eq!(judge(&tls(Some("allowed.test.")), &host, 443), Ok(()), "a trailing dot does not matter");
        assert_eq!(judge(&tls(Some("ALLOWED.test")), &host, 8443), Ok(()), "nor does case");
        let err = judge(&tls(Some("other.test")), &host, 443).unwrap_err();
        assert_eq!(err, OpeningRefusal::SniMismatch { sni: "other.test".into(), host: "allowed.test".into() });
        assert!(err.to_string().starts_with("sni_mismatch: "), "{err}");
        assert!(judge(&tls(Some("sub.allowed.test")), &host, 443).is_err(), "a subdomain is another host");
        assert!(judge(&tls(Some("allowed.test")), &name("203.0.113.7"), 443).is_err(), "an address is not a name");
    }

    #[test]
    fn no_server_name_passes_only_toward_an_address() {
        assert_eq!(judge(&tls(None), &name("allowed.test"), 443), Err(OpeningRefusal::SniMissing));
        assert_eq!(judge(&tls(None), &name("203.0.113.7"), 443), Ok(()));
        assert_eq!(judge(&tls(None), &name("[2001:db8::1]"), 8443), Ok(()));
    }

    #[test]
    fn plain_bytes_pass_everywhere_but_port_443_and_bad_or_huge_hellos_nowhere() {
        let host = name("allowed.test");
        assert_eq!(judge(&Opening::NotTls, &host, 443), Err(OpeningRefusal::NotTls));
        assert_eq!(judge(&Opening::NotTls, &host, 22), Ok(()));
        assert_eq!(judge(&Opening::NotTls, &host, 80), Ok(()));
        assert!(judge(&Opening::BadHello("x".into()), &host, 22).is_err());
        assert_eq!(judge(&Opening::TooLarge, &host, 8443), Err(OpeningRefusal::TooLarge));
    }

    #[tokio::test(start_paused = true)]
    async fn the_opening_waits_for_the_client_at_most_the_timeout_on_443_and_from_its_first_byte_elsewhere() {
        let timeout = Duration::from_secs(10);
        let host = name("allowed.test");
        // Port 443: a client that says nothing is refused when the time is up.
        let (mut client, _client_peer) = tokio::io::duplex(1024);
        let (mut upstream, _upstream_peer) = tokio::io::duplex(1024);
        let start = Instant::now();
        let judged = open(&mut client, &mut upstream, &host, 443, timeout).await;
        assert!(matches!(judged, Judged::Refuse(OpeningRefusal::Timeout(10_000))));
        assert!(
            start.elapsed() >= timeout && start.elapsed() < timeout + Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
        // Elsewhere: silence is no opening (the upstream may speak first); a ClientHello begun must end in time.
        let (mut client, mut client_peer) = tokio::io::duplex(1024);
        let (mut upstream, mut upstream_peer) = tokio::io::duplex(1024);
        let task = tokio::spawn(async move {
            let judged = open(&mut client, &mut upstream, &host, 22, timeout).await;
            (judged, Instant::now())
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        upstream_peer.write_all(b"SSH-2.0-banner\r\n").await.unwrap();
        let mut banner = [0u8; 16];
        client_peer.read_exact(&mut banner).await.unwrap();
        assert_eq!(&banner, b"SSH-2.0-banner\r\n", "the upstream's first words flow while the client is silent");
        let begun = Instant::now();
        client_peer.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00]).await.unwrap();
        let (judged, ended) = task.await.unwrap();
        assert!(matches!(judged, Judged::Refuse(OpeningRefusal::Timeout(_))));
        assert!(ended - begun >= timeout && ended - begun < timeout + Duration::from_secs(1), "{:?}", ended - begun);
    }

    #[tokio::test]
    async fn plain_bytes_elsewhere_are_forwarded_whole() {
        let (mut client, mut client_peer) = tokio::io::duplex(1024);
        let (mut upstream, _upstream_peer) = tokio::io::duplex(1024);
        client_peer.write_all(b"SSH-2.0-client\r\n").await.unwrap();
        let judged = open(&mut client, &mut upstream, &name("allowed.test"), 22, Duration::from_secs(1)).await;
        assert!(matches!(judged, Judged::Forward(bytes) if bytes == b"SSH-2.0-client\r\n"));
    }
}
