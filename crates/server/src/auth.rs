//! Authentication: `Authorization: Bearer KEY` → the `Tenant` the key belongs to, or 401 (the `/v1` middleware that
//! asks is `api::authenticate`).
//!
//! Keys are compared in constant time: each configured key is kept zero-padded to `MAX_KEY_BYTES` with its length,
//! and a presented key is compared against *every* configured key (padded bytes and length, with `subtle`), so the
//! time taken does not depend on which key matched, how many leading bytes matched or how long the right key is.
//! Keys never appear in logs or errors.

use std::sync::Arc;

use axum::http::HeaderValue;
use subtle::{Choice, ConditionallySelectable, ConstantTimeEq};

use sandkasten_scan::ScanPolicy;

use crate::config::{MAX_KEY_BYTES, ServerConfig};
use crate::store::Quota;

/// The tenant a request acts for: every sandbox belongs to exactly one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// The tenant's name.
    pub name: Arc<str>,
    /// Its quota.
    pub quota: Quota,
    /// Whether it may change operator-wide settings (`admin = true` in its `[[tenants]]` entry).
    pub admin: bool,
    /// Its scan policy: its own `scan`, else the server's `[scan]`.
    pub scan: Arc<ScanPolicy>,
    /// Whether its code is trusted (`trust` in its `[[tenants]]` entry; what `isolation: "auto"` asks first).
    pub trust: crate::config::Trust,
}

/// Why a request's `Authorization` header authenticates no tenant (answered as 401 with this message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization` header.
    #[error("missing API key: send the header 'Authorization: Bearer <key>'")]
    MissingKey,
    /// A header that is not `Bearer <key>`.
    #[error("the Authorization header must be 'Bearer <key>'")]
    NotBearer,
    /// A key no tenant has.
    #[error("invalid API key")]
    InvalidKey,
}

/// Name of the only tenant when authentication is off (`insecure_no_auth`).
pub const UNAUTHENTICATED_TENANT: &str = "default";

struct KeyEntry {
    padded: [u8; MAX_KEY_BYTES],
    len: u64,
    tenant: u32,
}

/// All configured keys, ready for constant-time lookup.
pub(crate) struct Keyring {
    entries: Vec<KeyEntry>,
    tenants: Vec<Tenant>,
    /// Set when authentication is off: every request is this tenant.
    anonymous: Option<Tenant>,
}

fn pad(key: &[u8]) -> Option<[u8; MAX_KEY_BYTES]> {
    let mut padded = [0u8; MAX_KEY_BYTES];
    padded.get_mut(..key.len())?.copy_from_slice(key);
    Some(padded)
}

impl Keyring {
    /// Builds the keyring of a (validated) configuration.
    pub(crate) fn from_config(config: &ServerConfig) -> Keyring {
        let mut entries = Vec::new();
        let mut tenants = Vec::new();
        for (index, tenant) in config.tenants.iter().enumerate() {
            tenants.push(Tenant {
                name: Arc::from(tenant.name.as_str()),
                quota: tenant.quota(),
                admin: tenant.admin,
                scan: Arc::new(tenant.scan.clone().unwrap_or_else(|| config.scan.clone())),
                trust: tenant.trust,
            });
            for key in &tenant.api_keys {
                if let (Some(padded), Ok(tenant)) = (pad(key.as_bytes()), u32::try_from(index)) {
                    entries.push(KeyEntry { padded, len: key.as_bytes().len() as u64, tenant });
                }
            }
        }
        let anonymous = config.insecure_no_auth.then(|| {
            let configured = config.tenants.iter().find(|t| t.name == UNAUTHENTICATED_TENANT);
            let default = crate::config::TenantConfig::new(UNAUTHENTICATED_TENANT);
            let tenant = configured.unwrap_or(&default);
            Tenant {
                name: Arc::from(UNAUTHENTICATED_TENANT),
                quota: tenant.quota(),
                admin: tenant.admin,
                scan: Arc::new(tenant.scan.clone().unwrap_or_else(|| config.scan.clone())),
                trust: tenant.trust,
            }
        });
        Keyring { entries, tenants, anonymous }
    }

    /// Every tenant requests can act as: the configured ones, and `default` when authentication is off.
    pub(crate) fn tenants(&self) -> impl Iterator<Item = &Tenant> {
        let configured = self.tenants.iter().filter(|t| self.anonymous.as_ref().is_none_or(|a| a.name != t.name));
        configured.chain(self.anonymous.iter())
    }

    /// The tenant owning `presented`, comparing against every key in constant time.
    fn find(&self, presented: &[u8]) -> Option<Tenant> {
        let padded = pad(presented)?;
        let len = presented.len() as u64;
        let mut found = Choice::from(0);
        let mut tenant = 0u32;
        for entry in &self.entries {
            let same = entry.padded[..].ct_eq(&padded[..]) & entry.len.ct_eq(&len);
            tenant = u32::conditional_select(&tenant, &entry.tenant, same);
            found |= same;
        }
        if bool::from(found) { self.tenants.get(tenant as usize).cloned() } else { None }
    }

    /// The tenant owning a key presented bare (the E2B facade's `X-API-KEY`); every request's tenant when
    /// authentication is off.
    pub(crate) fn tenant_of_key(&self, presented: &[u8]) -> Option<Tenant> {
        match &self.anonymous {
            Some(anonymous) => Some(anonymous.clone()),
            None => self.find(presented.trim_ascii()),
        }
    }

    /// The tenant a request's `Authorization` header authenticates.
    pub(crate) fn authenticate(&self, header: Option<&HeaderValue>) -> Result<Tenant, AuthError> {
        if let Some(anonymous) = &self.anonymous {
            return Ok(anonymous.clone());
        }
        let header = header.ok_or(AuthError::MissingKey)?;
        let value = header.as_bytes();
        let key = match value.get(..7) {
            Some(scheme) if scheme.eq_ignore_ascii_case(b"bearer ") => value[7..].trim_ascii(),
            _ => return Err(AuthError::NotBearer),
        };
        self.find(key).ok_or(AuthError::InvalidKey)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ApiKey, TenantConfig};

    fn keyring() -> Keyring {
        let mut a = TenantConfig::new("a");
        a.api_keys = vec![ApiKey::new("key-of-tenant-a-0001"), ApiKey::new("second-key-of-a-0002")];
        let mut b = TenantConfig::new("b");
        b.api_keys = vec![ApiKey::new("key-of-tenant-b-0001")];
        Keyring::from_config(&ServerConfig { tenants: vec![a, b], ..ServerConfig::default() })
    }

    fn header(value: &str) -> HeaderValue {
        HeaderValue::from_str(value).unwrap_or(HeaderValue::from_static(""))
    }

    fn tenant_of(ring: &Keyring, value: &str) -> Option<String> {
        ring.authenticate(Some(&header(value))).ok().map(|t| t.name.to_string())
    }

    #[test]
    fn each_key_finds_its_tenant() {
        let ring = keyring();
        assert_eq!(tenant_of(&ring, "Bearer key-of-tenant-a-0001").as_deref(), Some("a"));
        assert_eq!(tenant_of(&ring, "bearer second-key-of-a-0002").as_deref(), Some("a"));
        assert_eq!(tenant_of(&ring, "Bearer key-of-tenant-b-0001").as_deref(), Some("b"));
    }

    #[test]
    fn prefixes_extensions_and_other_schemes_are_refused() {
        let ring = keyring();
        for value in [
            "Bearer key-of-tenant-a-000",
            "Bearer key-of-tenant-a-00011",
            "Bearer ",
            "Basic key-of-tenant-a-0001",
            "key-of-tenant-a-0001",
            &format!("Bearer {}", "x".repeat(MAX_KEY_BYTES + 1)),
        ] {
            assert_eq!(tenant_of(&ring, value), None, "{value}");
        }
        assert!(ring.authenticate(None).is_err());
    }

    #[test]
    fn no_auth_mode_is_the_default_tenant() {
        let ring = Keyring::from_config(&ServerConfig { insecure_no_auth: true, ..ServerConfig::default() });
        assert_eq!(ring.authenticate(None).ok().map(|t| t.name.to_string()).as_deref(), Some("default"));
    }
}
