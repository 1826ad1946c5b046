#![allow(clippy::unwrap_used, clippy::expect_used)]

use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls_pki_types::{ServerName, UnixTime};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::*;
use crate::host::canonicalize_host;

fn host(h: &str) -> Host {
    canonicalize_host(h).unwrap()
}

fn ca(hosts: &[&str]) -> SandboxCa {
    SandboxCa::generate("sb-1", &hosts.iter().map(|h| (*h).to_owned()).collect::<Vec<_>>()).unwrap()
}

/// A standard verifier (webpki, as rustls clients use it) trusting only `ca`.
fn verifier(ca: &SandboxCa) -> Arc<WebPkiServerVerifier> {
    let mut roots = RootCertStore::empty();
    roots.add(ca.cert_der()).unwrap();
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider()).build().unwrap()
}

fn verify(ca: &SandboxCa, leaf: &CertificateDer<'static>, name: &str) -> Result<(), rustls::Error> {
    let name = ServerName::try_from(name.to_owned()).unwrap();
    verifier(ca).verify_server_cert(leaf, &[], &name, &[], UnixTime::now()).map(drop)
}

fn general_names(subtrees: Option<&Vec<x509_parser::extensions::GeneralSubtree<'_>>>) -> Vec<String> {
    subtrees
        .into_iter()
        .flatten()
        .map(|s| match &s.base {
            GeneralName::DNSName(name) => format!("dns:{name}"),
            GeneralName::IPAddress(bytes) => format!("ip:{bytes:?}"),
            other => format!("{other:?}"),
        })
        .collect()
}

#[test]
fn the_ca_is_name_constrained_to_its_hosts_and_short_lived_and_its_leaves_shorter() {
    let ca = ca(&["allowed.test:443", "*.example.org", "203.0.113.7"]);
    let der = ca.cert_der();
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    let constraints = cert.name_constraints().unwrap().expect("a name constraints extension");
    assert!(constraints.critical, "name constraints must be critical");
    assert_eq!(
        general_names(constraints.value.permitted_subtrees.as_ref()),
        ["dns:allowed.test", "dns:.example.org", "ip:[203, 0, 113, 7, 255, 255, 255, 255]"]
    );
    assert!(constraints.value.excluded_subtrees.is_none(), "every kind of name has a permitted subtree");
    let validity = cert.validity();
    let ca_span = validity.not_after.timestamp() - validity.not_before.timestamp();
    assert!(ca_span as u64 <= (CA_VALIDITY + BACKDATE).as_secs(), "{ca_span} s");
    assert!(
        validity.not_after.timestamp() - OffsetDateTime::now_utc().unix_timestamp() <= CA_VALIDITY.as_secs() as i64
    );

    let (leaf, _) = ca.mint("allowed.test", OffsetDateTime::now_utc()).unwrap();
    let (_, leaf) = X509Certificate::from_der(&leaf).unwrap();
    let span = leaf.validity().not_after.timestamp() - leaf.validity().not_before.timestamp();
    assert!(span as u64 <= (LEAF_VALIDITY + BACKDATE).as_secs(), "{span} s");
    // A leaf never outlives its CA, even when minted near the CA's end.
    let (late, _) = ca.mint("allowed.test", OffsetDateTime::now_utc() + CA_VALIDITY - LEAF_RENEWAL).unwrap();
    let (_, late) = X509Certificate::from_der(&late).unwrap();
    assert!(late.validity().not_after.timestamp() <= validity.not_after.timestamp());
}

#[test]
fn a_kind_of_name_the_hosts_do_not_use_is_excluded_entirely() {
    let ca = ca(&["allowed.test"]);
    let der = ca.cert_der();
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    let constraints = cert.name_constraints().unwrap().unwrap();
    assert_eq!(
        general_names(constraints.value.excluded_subtrees.as_ref()),
        [format!("ip:{:?}", [0u8; 8]), format!("ip:{:?}", [0u8; 32])]
    );
    let only_ips = self::ca(&["203.0.113.7"]);
    let der = only_ips.cert_der();
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    let constraints = cert.name_constraints().unwrap().unwrap();
    assert_eq!(general_names(constraints.value.excluded_subtrees.as_ref()), ["dns:"]);
}

#[test]
fn a_standard_verifier_rejects_leaves_outside_the_constraints() {
    let ca = ca(&["allowed.test", "*.example.org"]);
    let now = OffsetDateTime::now_utc();
    // Positive control: leaves inside verify.
    for name in ["allowed.test", "api.example.org"] {
        let (leaf, _) = ca.mint(name, now).unwrap();
        verify(&ca, &leaf, name).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    // Signed by the same key, but outside: another name, the wildcard's apex, a lookalike suffix, an address.
    for name in ["evil.test", "example.org", "notallowed.test", "127.0.0.1"] {
        let (leaf, _) = ca.mint(name, now).unwrap();
        let err = verify(&ca, &leaf, name).expect_err(name);
        assert!(format!("{err:?}").contains("NameConstraint"), "{name}: {err:?}");
    }
}

#[test]
fn the_proxy_mints_no_leaf_outside_the_constraints() {
    let ca = ca(&["allowed.test", "*.example.org", "203.0.113.7:8443"]);
    for inside in ["allowed.test", "sub.allowed.test", "api.example.org", "203.0.113.7"] {
        assert!(ca.permits(&host(inside)), "{inside}");
        assert!(ca.server_config(&host(inside)).is_ok(), "{inside}");
    }
    for outside in ["evil.test", "example.org", "notallowed.test", "203.0.113.8", "127.0.0.1"] {
        assert!(!ca.permits(&host(outside)), "{outside}");
        let err = ca.server_config(&host(outside)).unwrap_err();
        assert!(matches!(err, CaError::NotPermitted(_)), "{outside}: {err}");
    }
    assert!(SandboxCa::generate("sb", &["bad host".to_owned()]).is_err());
}

#[test]
fn leaves_are_cached_per_host_and_replaced_before_they_end() {
    let ca = ca(&["allowed.test"]);
    assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
    let a = ca.server_config(&host("allowed.test")).unwrap();
    let b = ca.server_config(&host("allowed.test")).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    ca.leaves.lock().unwrap().get_mut("allowed.test").unwrap().renew_at = OffsetDateTime::now_utc();
    let c = ca.server_config(&host("allowed.test")).unwrap();
    assert!(!Arc::ptr_eq(&a, &c), "a leaf due for renewal was served again");
    assert!(!format!("{ca:?}").contains("PRIVATE"));
}
