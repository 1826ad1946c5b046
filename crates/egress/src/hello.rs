//! The opening bytes of a blind tunnel: whether they are a TLS ClientHello and, if so, which server name (SNI) it
//! asks for. rustls's [`Acceptor`] parses the ClientHello without starting a handshake; every byte is kept, since all
//! of them go to the upstream unchanged once the opening is judged. At most [`MAX_HELLO_BYTES`] are buffered.

use rustls::server::Acceptor;

/// Most bytes buffered while waiting for a complete ClientHello; a larger one is refused. Real ones take well under
/// 2 KiB (a few KiB with post-quantum key shares) and never need more than one 16 KiB record.
pub(crate) const MAX_HELLO_BYTES: usize = 16 * 1024;

/// The content type byte that starts a TLS handshake record.
const HANDSHAKE_RECORD: u8 = 0x16;

/// What a tunnel's opening bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Opening {
    /// A complete TLS ClientHello and the server name it carries (lowercase, as rustls gives it; an IP address sent
    /// as a name counts as none, as rustls treats it).
    Tls {
        /// The SNI host name, if the client sent one.
        server_name: Option<String>,
    },
    /// Not TLS: the first byte does not start a TLS handshake record.
    NotTls,
    /// Starts like TLS but is no valid ClientHello; rustls's reason.
    BadHello(String),
    /// No complete ClientHello within [`MAX_HELLO_BYTES`].
    TooLarge,
}

/// Collects a client's opening bytes until [`Opening`] is known.
pub(crate) struct HelloReader {
    acceptor: Acceptor,
    bytes: Vec<u8>,
}

impl HelloReader {
    pub(crate) fn new() -> HelloReader {
        HelloReader { acceptor: Acceptor::default(), bytes: Vec::new() }
    }

    /// Takes the next bytes the client sent; returns the opening once it is known, `None` while a ClientHello is
    /// still incomplete. Not to be called again after it returned `Some`.
    pub(crate) fn push(&mut self, data: &[u8]) -> Option<Opening> {
        if data.is_empty() {
            return None;
        }
        if self.bytes.is_empty() && data[0] != HANDSHAKE_RECORD {
            self.bytes.extend_from_slice(data);
            return Some(Opening::NotTls);
        }
        if self.bytes.len() + data.len() > MAX_HELLO_BYTES {
            return Some(Opening::TooLarge);
        }
        self.bytes.extend_from_slice(data);
        let mut rest = data;
        loop {
            match self.acceptor.accept() {
                Ok(Some(accepted)) => {
                    let server_name = accepted.client_hello().server_name().map(str::to_owned);
                    return Some(Opening::Tls { server_name });
                }
                Ok(None) => {}
                Err((error, _alert)) => return Some(Opening::BadHello(error.to_string())),
            }
            if rest.is_empty() {
                return None;
            }
            match self.acceptor.read_tls(&mut rest) {
                Ok(0) => return Some(Opening::BadHello("rustls takes no more bytes before the ClientHello".into())),
                Ok(_) => {}
                Err(error) => return Some(Opening::BadHello(error.to_string())),
            }
        }
    }

    /// Whether any bytes arrived yet.
    pub(crate) fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Every byte taken so far, in order.
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::sync::Arc;

    use rustls::pki_types::ServerName;
    use rustls::{ClientConfig, ClientConnection, RootCertStore};

    use super::*;

    /// The ClientHello a rustls client sends for `name`, with or without SNI.
    fn client_hello(name: &str, sni: bool) -> Vec<u8> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(RootCertStore::empty())
            .with_no_client_auth();
        config.enable_sni = sni;
        let name = ServerName::try_from(name.to_owned()).unwrap();
        let mut conn = ClientConnection::new(Arc::new(config), name).unwrap();
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out).unwrap();
        }
        out
    }

    #[test]
    fn a_client_hello_gives_its_server_name_lowercase_one_byte_at_a_time_too() {
        let hello = client_hello("Allowed.Test", true);
        let mut whole = HelloReader::new();
        assert_eq!(whole.push(&hello), Some(Opening::Tls { server_name: Some("allowed.test".into()) }));
        let mut trickled = HelloReader::new();
        let (last, head) = hello.split_last().unwrap();
        for byte in head {
            assert_eq!(trickled.push(std::slice::from_ref(byte)), None, "complete before its last byte");
        }
        assert_eq!(trickled.push(&[*last]), Some(Opening::Tls { server_name: Some("allowed.test".into()) }));
        assert_eq!(trickled.into_bytes(), hello, "every byte is kept for the upstream");
    }

    #[test]
    fn no_sni_gives_no_server_name_and_clients_send_none_for_an_address() {
        assert_eq!(
            HelloReader::new().push(&client_hello("allowed.test", false)),
            Some(Opening::Tls { server_name: None })
        );
        assert_eq!(HelloReader::new().push(&client_hello("127.0.0.1", true)), Some(Opening::Tls { server_name: None }));
    }

    #[test]
    fn plain_bytes_are_not_tls_at_the_first_byte() {
        let mut reader = HelloReader::new();
        assert_eq!(reader.push(b"GET / HTTP/1.1\r\n"), Some(Opening::NotTls));
        assert_eq!(reader.into_bytes(), b"GET / HTTP/1.1\r\n");
        assert_eq!(HelloReader::new().push(&[]), None, "nothing read is nothing known");
    }

    #[test]
    fn a_handshake_record_that_is_no_client_hello_is_bad() {
        // A handshake record holding a ServerHello (type 2) instead.
        let record = [0x16, 0x03, 0x01, 0x00, 0x06, 0x02, 0x00, 0x00, 0x02, 0x03, 0x03];
        assert!(matches!(HelloReader::new().push(&record), Some(Opening::BadHello(_))));
        // An application data record right after a handshake byte sequence that cannot be TLS.
        let garbage = [0x16, 0xff, 0xff, 0xff, 0xff, 0x00];
        assert!(matches!(HelloReader::new().push(&garbage), Some(Opening::BadHello(_))));
    }

    #[test]
    fn a_client_hello_larger_than_the_cap_is_refused_without_buffering_it() {
        // A record header announcing 16 KiB, a ClientHello header announcing 64 KiB, then filler: rustls would wait
        // for all of it; the reader stops at the cap.
        let mut reader = HelloReader::new();
        assert_eq!(reader.push(&[0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0x00, 0xff, 0xff]), None);
        let filler = vec![0u8; 1024];
        let mut outcome = None;
        for _ in 0..32 {
            outcome = reader.push(&filler);
            if outcome.is_some() {
                break;
            }
        }
        assert_eq!(outcome, Some(Opening::TooLarge));
        assert!(reader.into_bytes().len() <= MAX_HELLO_BYTES);
    }
}
