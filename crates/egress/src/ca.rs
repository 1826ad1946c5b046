//! The per-sandbox certificate authority used for TLS interception: made fresh for each sandbox, its private
//! key never leaves the host process, and its leaf certificates (one per intercepted host, cached) are served
//! only to that sandbox.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::ServerConfig;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::tls::provider;

/// Why a CA or leaf certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// rcgen failed.
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// rustls refused the generated certificate.
    #[error("tls configuration failed: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Most leaf configurations cached per CA; past it the cache starts over (a sandbox CONNECTing to endless
/// subdomains of a wildcard secret host cannot grow host memory without bound).
const MAX_CACHED_LEAVES: usize = 1024;

/// A sandbox's interception CA. Install `cert_pem()` in the sandbox's trust store.
pub struct SandboxCa {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    leaf_key: KeyPair,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

impl fmt::Debug for SandboxCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SandboxCa").field("cert_pem", &self.cert_pem).finish_non_exhaustive()
    }
}

impl SandboxCa {
    /// Generates a new CA (ECDSA P-256) named after the sandbox.
    pub fn generate(sandbox_id: &str) -> Result<SandboxCa, CaError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut dn = DistinguishedName::new();
        let id: String = sandbox_id.chars().filter(|c| c.is_ascii_graphic()).take(40).collect();
        dn.push(DnType::CommonName, format!("sandkasten egress CA for sandbox {id}"));
        dn.push(DnType::OrganizationName, "sandkasten");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let cert = params.self_signed(&key)?;
        let leaf_key = KeyPair::generate()?;
        Ok(SandboxCa {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            issuer: Issuer::new(params, key),
            leaf_key,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> String {
        self.cert_pem.clone()
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> CertificateDer<'static> {
        self.cert_der.clone()
    }

    /// A TLS server configuration presenting a leaf for `host` (a canonical name or IP), made once per host.
    pub(crate) fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, CaError> {
        if let Some(found) = self.leaves.lock().unwrap_or_else(|e| e.into_inner()).get(host) {
            return Ok(found.clone());
        }
        let mut params = CertificateParams::new(vec![host.to_owned()])?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, host);
        params.distinguished_name = dn;
        params.is_ca = IsCa::NoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let leaf = params.signed_by(&self.leaf_key, &self.issuer)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone(), self.cert_der.clone()], key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if leaves.len() >= MAX_CACHED_LEAVES {
            leaves.clear();
        }
        leaves.insert(host.to_owned(), config.clone());
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn ca_is_pem_and_leaves_are_cached_per_host() {
        let ca = SandboxCa::generate("sb-1").unwrap();
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        let a = ca.server_config("allowed.test").unwrap();
        let b = ca.server_config("allowed.test").unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(ca.server_config("127.0.0.1").is_ok(), "IP leaves get an IP SAN");
        assert!(!format!("{ca:?}").contains("PRIVATE"));
    }
}
