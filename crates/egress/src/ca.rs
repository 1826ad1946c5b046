//! The per-sandbox certificate authority used for TLS interception: made fresh for each sandbox that holds secrets,
//! its private key never leaves the host process, and its leaf certificates (one per intercepted host, cached) are
//! served only to that sandbox.
//!
//! The CA is constrained to its secrets' hosts (RFC 5280 name constraints, critical): a standard verifier rejects any
//! leaf it signs for another name or address, so even a leaked key could not impersonate other hosts to a client that
//! trusts it; the proxy does not mint such leaves in the first place ([`SandboxCa::permits`]). It is valid for
//! [`CA_VALIDITY`], its leaves for [`LEAF_VALIDITY`] (re-minted before they end).

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CidrSubnet, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
    GeneralSubtree, IsCa, Issuer, KeyPair, KeyUsagePurpose, NameConstraints,
};
use rustls::ServerConfig;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use time::OffsetDateTime;

use crate::host::Host;
use crate::policy::{Pattern, PolicyError, Subtree};
use crate::tls::provider;

/// How long a sandbox's CA is valid: the longest lifetime one grant gives a sandbox (a week: `max_timeout_s` is at
/// most 604 800) plus a day. A sandbox kept alive longer by extending its timeout loses interception: its clients
/// refuse the expired CA, so the secrets stop working and nothing is sent.
pub const CA_VALIDITY: Duration = Duration::from_secs(8 * 24 * 3600);
/// How long a leaf certificate is valid (never past the CA's end); the proxy mints a new one before it ends.
pub const LEAF_VALIDITY: Duration = Duration::from_secs(24 * 3600);
/// A cached leaf with less than this left is replaced.
const LEAF_RENEWAL: Duration = Duration::from_secs(3600);
/// Certificates start this long before they are made: their times have one-second resolution (the sandbox shares
/// the host's clock, so no more is needed).
const BACKDATE: Duration = Duration::from_secs(300);
/// Most leaf configurations cached per CA; past it the cache starts over (a sandbox CONNECTing to endless
/// subdomains of a wildcard secret host cannot grow host memory without bound).
const MAX_CACHED_LEAVES: usize = 1024;

/// Why a CA or leaf certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// rcgen failed.
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// rustls refused the generated certificate.
    #[error("tls configuration failed: {0}")]
    Rustls(#[from] rustls::Error),
    /// A host pattern the CA is to be constrained to is invalid.
    #[error("ca scope: {0}")]
    Pattern(#[from] PolicyError),
    /// The host is outside the CA's name constraints.
    #[error("{0} is outside the sandbox CA's name constraints")]
    NotPermitted(String),
}

/// A sandbox's interception CA. Install `cert_pem()` in the sandbox's trust store.
pub struct SandboxCa {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    leaf_key: KeyPair,
    scope: Vec<Subtree>,
    not_after: OffsetDateTime,
    leaves: Mutex<HashMap<String, Leaf>>,
}

/// A cached leaf: its TLS configuration and when to replace it.
struct Leaf {
    config: Arc<ServerConfig>,
    renew_at: OffsetDateTime,
}

impl fmt::Debug for SandboxCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SandboxCa")
            .field("cert_pem", &self.cert_pem)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl SandboxCa {
    /// Generates a new CA (ECDSA P-256) named after the sandbox, valid for [`CA_VALIDITY`], that may vouch only for
    /// the hosts the patterns `hosts` cover (the secrets' hosts, policy syntax; ports do not matter to a certificate).
    pub fn generate(sandbox_id: &str, hosts: &[String]) -> Result<SandboxCa, CaError> {
        let scope = hosts
            .iter()
            .map(|h| Pattern::parse("secret hosts", h).map(|p| p.subtree()))
            .collect::<Result<Vec<_>, _>>()?;
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
        params.name_constraints = Some(name_constraints(&scope));
        let now = OffsetDateTime::now_utc();
        params.not_before = now - BACKDATE;
        params.not_after = now + CA_VALIDITY;
        let cert = params.self_signed(&key)?;
        let leaf_key = KeyPair::generate()?;
        Ok(SandboxCa {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            not_after: params.not_after,
            issuer: Issuer::new(params, key),
            leaf_key,
            scope,
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

    /// Whether the CA's name constraints cover `host`, i.e. whether a leaf for it would be valid. A secret's host
    /// added after the CA was made is not covered: tunnels to it stay blind.
    pub fn permits(&self, host: &Host) -> bool {
        self.scope.iter().any(|subtree| match (subtree, host) {
            (Subtree::Name(base), Host::Name(name)) => {
                name == base || name.strip_suffix(base.as_str()).is_some_and(|prefix| prefix.ends_with('.'))
            }
            (Subtree::Subdomains(suffix), Host::Name(name)) => name.len() > suffix.len() && name.ends_with(suffix),
            (Subtree::Ip(ip), Host::Ip(addr)) => ip == addr,
            _ => false,
        })
    }

    /// A TLS server configuration presenting a leaf for `host`, made once per host (and again before it expires).
    pub(crate) fn server_config(&self, host: &Host) -> Result<Arc<ServerConfig>, CaError> {
        if !self.permits(host) {
            return Err(CaError::NotPermitted(host.audit_string()));
        }
        let key = host.audit_string();
        let now = OffsetDateTime::now_utc();
        if let Some(found) = self.leaves.lock().unwrap_or_else(|e| e.into_inner()).get(&key)
            && now < found.renew_at
        {
            return Ok(found.config.clone());
        }
        let (leaf, not_after) = self.mint(&key, now)?;
        let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![leaf, self.cert_der.clone()], private)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if leaves.len() >= MAX_CACHED_LEAVES {
            leaves.clear();
        }
        leaves.insert(key, Leaf { config: config.clone(), renew_at: not_after - LEAF_RENEWAL });
        Ok(config)
    }

    /// Signs a leaf for `host` (a canonical name or IP), valid from `now` for [`LEAF_VALIDITY`] or until the CA ends.
    fn mint(&self, host: &str, now: OffsetDateTime) -> Result<(CertificateDer<'static>, OffsetDateTime), CaError> {
        let mut params = CertificateParams::new(vec![host.to_owned()])?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, host);
        params.distinguished_name = dn;
        params.is_ca = IsCa::NoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = now - BACKDATE;
        params.not_after = (now + LEAF_VALIDITY).min(self.not_after);
        let leaf = params.signed_by(&self.leaf_key, &self.issuer)?;
        Ok((leaf.der().clone(), params.not_after))
    }
}

/// The name constraints for `scope`: its names and addresses permitted; a kind of name it has none of (DNS names,
/// addresses) excluded entirely, since a kind missing from the permitted subtrees would be unconstrained (the CA/B
/// Forum's rule for technically constrained CAs: a zero-length DNS name, 0.0.0.0/0 and ::/0).
fn name_constraints(scope: &[Subtree]) -> NameConstraints {
    let permitted_subtrees: Vec<GeneralSubtree> = scope
        .iter()
        .map(|subtree| match subtree {
            Subtree::Name(name) | Subtree::Subdomains(name) => GeneralSubtree::DnsName(name.clone()),
            Subtree::Ip(ip) => {
                let bits = if ip.is_ipv4() { 32 } else { 128 };
                GeneralSubtree::IpAddress(CidrSubnet::from_addr_prefix(*ip, bits))
            }
        })
        .collect();
    let mut excluded_subtrees = Vec::new();
    if !scope.iter().any(|s| matches!(s, Subtree::Name(_) | Subtree::Subdomains(_))) {
        excluded_subtrees.push(GeneralSubtree::DnsName(String::new()));
    }
    if !scope.iter().any(|s| matches!(s, Subtree::Ip(_))) {
        for any in [IpAddr::from([0u8; 4]), IpAddr::from([0u8; 16])] {
            excluded_subtrees.push(GeneralSubtree::IpAddress(CidrSubnet::from_addr_prefix(any, 0)));
        }
    }
    NameConstraints { permitted_subtrees, excluded_subtrees }
}

#[cfg(test)]
mod tests;
