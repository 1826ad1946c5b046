//! rustls plumbing: the `ring` crypto provider and the client configuration for upstream TLS when
//! intercepting (system roots plus the operator's `upstream_ca_file`).

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use crate::config::ConfigError;

/// The crypto provider used everywhere (`ring`; no cmake needed).
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Client configuration for upstream TLS: system roots (as many as parse) plus every certificate in
/// `extra_ca_file`. Offers only HTTP/1.1.
pub(crate) fn upstream_client_config(extra_ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, ConfigError> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    let (added, ignored) = roots.add_parsable_certificates(native.certs);
    tracing::debug!(added, ignored, errors = native.errors.len(), "loaded system roots for upstream tls");
    if let Some(path) = extra_ca_file {
        let fail = |reason: String| ConfigError::UpstreamCa { path: path.to_owned(), reason };
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| fail(e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| fail(e.to_string()))?;
        if certs.is_empty() {
            return Err(fail("no PEM certificates in the file".into()));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| fail(e.to_string()))?;
        }
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_missing_or_empty_upstream_ca_file_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let err = upstream_client_config(Some(&missing)).unwrap_err().to_string();
        assert!(err.contains("missing.pem"), "{err}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = upstream_client_config(Some(&empty)).unwrap_err().to_string();
        assert!(err.contains("empty.pem") && err.contains("no PEM certificates"), "{err}");
        assert!(upstream_client_config(None).is_ok());
    }
}
