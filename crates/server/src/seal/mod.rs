//! Secret values at rest: sealed with XChaCha20-Poly1305 (RustCrypto's `chacha20poly1305`) under the server's secrets
//! key, with a random 24-byte nonce per value. The associated data binds a sealed value to its row (tenant and secret
//! name) and to the format and key that sealed it, so a value copied into another tenant's or another name's row does
//! not open.
//!
//! A sealed value is `format (1 byte) | key id (4) | nonce (24) | ciphertext and tag (value + 16)`. A key's id is its
//! check value (the first 4 bytes of the tag of an empty message under an all-zero nonce, which no sealed value uses):
//! it names a key in logs and errors without revealing it, and tells which values a previous key sealed.
//!
//! - [`key_source`] reads the keys the config names (or creates the default key file next to the database);
//! - [`rows`] seals the plaintext rows of older databases, re-seals what previous keys sealed, and scrubs the file.

pub mod key_source;
pub(crate) mod rows;

use std::fmt;

use chacha20poly1305::aead::rand_core::RngCore;
use chacha20poly1305::aead::{Aead, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use zeroize::Zeroizing;

/// Bytes of a secrets key.
pub const KEY_BYTES: usize = 32;
/// The format byte this build writes (and the only one it reads).
const FORMAT: u8 = 1;
const ID_BYTES: usize = 4;
const NONCE_BYTES: usize = 24;
const HEADER_BYTES: usize = 1 + ID_BYTES + NONCE_BYTES;
const TAG_BYTES: usize = 16;
/// Associated data of a key's check value (never that of a sealed value, which starts with [`AAD_PREFIX`]).
const CHECK_VALUE_AAD: &[u8] = b"sandkasten secrets key check value";
const AAD_PREFIX: &[u8] = b"sandkasten secret\0";

/// Why a value could not be sealed or opened. Messages name the row, never the value or a key.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The stored bytes are too short, or of a format this build does not know.
    #[error("secret {name:?} of tenant {tenant:?}: the stored value is not sealed in a format this build knows")]
    Malformed {
        /// The row's tenant.
        tenant: String,
        /// The row's secret name.
        name: String,
    },
    /// The value was sealed with a key the server does not have.
    #[error("secret {name:?} of tenant {tenant:?} is sealed with key {key_id}, which is not configured")]
    UnknownKey {
        /// The row's tenant.
        tenant: String,
        /// The row's secret name.
        name: String,
        /// The key that sealed it.
        key_id: KeyId,
    },
    /// Authentication failed: the stored value was altered, or moved from another row.
    #[error(
        "secret {name:?} of tenant {tenant:?} does not open under key {key_id}: the stored value was altered or \
         belongs to another row"
    )]
    Forged {
        /// The row's tenant.
        tenant: String,
        /// The row's secret name.
        name: String,
        /// The key it claims.
        key_id: KeyId,
    },
    /// Values are sealed with keys the server does not have: the store is not opened, and nothing is changed.
    #[error(
        "{count} secret value(s) are sealed with keys this server does not have ({keys}); its \
         current key is {current}. Configure the key that sealed them: as [secrets] key_file (or key_env), or while \
         rotating under previous_key_files (or after a comma in key_env); the secrets were left as they are"
    )]
    MissingKeys {
        /// Values that cannot be opened.
        count: usize,
        /// The keys they need, with how many values each (`key 1a2b3c4d sealed 2, ...`).
        keys: String,
        /// The server's current key.
        current: KeyId,
    },
    /// No randomness for a nonce or a key.
    #[error("cannot read randomness from the kernel: {0}")]
    Random(String),
    /// The cipher refused (not expected: values are small).
    #[error("sealing failed")]
    Cipher,
}

/// A key's id: its check value, shown as 8 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyId([u8; ID_BYTES]);

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

/// One secrets key (the cipher wipes it when dropped). Its `Debug` form shows the id only.
pub struct SealKey {
    id: KeyId,
    cipher: XChaCha20Poly1305,
}

impl fmt::Debug for SealKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SealKey({})", self.id)
    }
}

impl SealKey {
    /// The key of these bytes.
    pub fn from_bytes(bytes: &[u8; KEY_BYTES]) -> Result<SealKey, SealError> {
        let cipher = XChaCha20Poly1305::new(bytes.into());
        let check = cipher
            .encrypt(&XNonce::default(), Payload { msg: b"", aad: CHECK_VALUE_AAD })
            .map_err(|_| SealError::Cipher)?;
        let mut id = [0u8; ID_BYTES];
        id.copy_from_slice(check.get(..ID_BYTES).ok_or(SealError::Cipher)?);
        Ok(SealKey { id: KeyId(id), cipher })
    }

    /// A new random key, and its bytes (to be written to a key file).
    pub fn generate() -> Result<(SealKey, Zeroizing<[u8; KEY_BYTES]>), SealError> {
        let mut bytes = Zeroizing::new([0u8; KEY_BYTES]);
        OsRng.try_fill_bytes(bytes.as_mut()).map_err(|e| SealError::Random(e.to_string()))?;
        Ok((SealKey::from_bytes(&bytes)?, bytes))
    }

    /// Its id.
    pub fn id(&self) -> KeyId {
        self.id
    }
}

/// The data a sealed value is bound to: this format, the key, and the row (each part length-prefixed).
fn associated_data(key_id: KeyId, tenant: &str, name: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(AAD_PREFIX.len() + 1 + ID_BYTES + 16 + tenant.len() + name.len());
    aad.extend_from_slice(AAD_PREFIX);
    aad.push(FORMAT);
    aad.extend_from_slice(&key_id.0);
    for part in [tenant, name] {
        aad.extend_from_slice(&(part.len() as u64).to_be_bytes());
        aad.extend_from_slice(part.as_bytes());
    }
    aad
}

/// The keys a server seals with (the current one) and opens with (it and the previous ones, while rotating).
#[derive(Debug)]
pub struct SealKeys {
    current: SealKey,
    previous: Vec<SealKey>,
}

impl SealKeys {
    /// `current`, plus `previous` keys that only open; a previous key equal to the current one (or to another
    /// previous one) is left out.
    pub fn new(current: SealKey, previous: Vec<SealKey>) -> SealKeys {
        let mut keys = SealKeys { current, previous: Vec::new() };
        for key in previous {
            if keys.key(key.id).is_none() {
                keys.previous.push(key);
            }
        }
        keys
    }

    /// A fresh random key known to nothing else (in-memory stores, tests).
    pub fn ephemeral() -> Result<SealKeys, SealError> {
        Ok(SealKeys::new(SealKey::generate()?.0, Vec::new()))
    }

    /// The id of the key new values are sealed with.
    pub fn current_id(&self) -> KeyId {
        self.current.id
    }

    /// The ids of the previous keys.
    pub fn previous_ids(&self) -> Vec<KeyId> {
        self.previous.iter().map(SealKey::id).collect()
    }

    /// Whether the key `id` is configured (current or previous).
    pub fn knows(&self, id: KeyId) -> bool {
        self.key(id).is_some()
    }

    fn key(&self, id: KeyId) -> Option<&SealKey> {
        std::iter::once(&self.current).chain(&self.previous).find(|key| key.id == id)
    }

    /// Seals `value` for the row (`tenant`, `name`) under the current key.
    pub fn seal(&self, tenant: &str, name: &str, value: &str) -> Result<Vec<u8>, SealError> {
        let mut nonce = XNonce::default();
        OsRng.try_fill_bytes(nonce.as_mut_slice()).map_err(|e| SealError::Random(e.to_string()))?;
        let key = &self.current;
        let aad = associated_data(key.id, tenant, name);
        let ciphertext =
            key.cipher.encrypt(&nonce, Payload { msg: value.as_bytes(), aad: &aad }).map_err(|_| SealError::Cipher)?;
        let mut sealed = Vec::with_capacity(HEADER_BYTES + ciphertext.len());
        sealed.push(FORMAT);
        sealed.extend_from_slice(&key.id.0);
        sealed.extend_from_slice(&nonce);
        sealed.extend_from_slice(&ciphertext);
        Ok(sealed)
    }

    /// Opens the value sealed for the row (`tenant`, `name`), with whichever configured key sealed it.
    pub fn open(&self, tenant: &str, name: &str, sealed: &[u8]) -> Result<String, SealError> {
        let row = || (tenant.to_owned(), name.to_owned());
        let key_id = key_id_of(sealed).ok_or_else(|| {
            let (tenant, name) = row();
            SealError::Malformed { tenant, name }
        })?;
        let key = self.key(key_id).ok_or_else(|| {
            let (tenant, name) = row();
            SealError::UnknownKey { tenant, name, key_id }
        })?;
        let forged = || {
            let (tenant, name) = row();
            SealError::Forged { tenant, name, key_id }
        };
        let nonce = XNonce::from_slice(&sealed[1 + ID_BYTES..HEADER_BYTES]);
        let aad = associated_data(key_id, tenant, name);
        let plain =
            key.cipher.decrypt(nonce, Payload { msg: &sealed[HEADER_BYTES..], aad: &aad }).map_err(|_| forged())?;
        // Only text is ever sealed: bytes that authenticate but are not UTF-8 cannot come from this server.
        String::from_utf8(plain).map_err(|_| forged())
    }

    /// Whether the current key sealed `sealed` (false for another key's value, or bytes that are not a sealed value).
    pub fn is_current(&self, sealed: &[u8]) -> bool {
        key_id_of(sealed) == Some(self.current.id)
    }
}

/// The id of the key that sealed `sealed`; `None` when it is not a sealed value of this format.
pub fn key_id_of(sealed: &[u8]) -> Option<KeyId> {
    if sealed.len() < HEADER_BYTES + TAG_BYTES || sealed[0] != FORMAT {
        return None;
    }
    let mut id = [0u8; ID_BYTES];
    id.copy_from_slice(&sealed[1..1 + ID_BYTES]);
    Some(KeyId(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> Result<SealKey, SealError> {
        SealKey::from_bytes(&[byte; KEY_BYTES])
    }

    #[test]
    fn a_sealed_value_opens_only_in_its_own_row() -> Result<(), SealError> {
        let keys = SealKeys::new(key(1)?, Vec::new());
        let sealed = keys.seal("t1", "TOKEN", "the-value")?;
        assert_eq!(keys.open("t1", "TOKEN", &sealed)?, "the-value");
        assert!(!sealed.windows(9).any(|w| w == b"the-value"), "the value is in the sealed bytes");
        for (tenant, name) in [("t2", "TOKEN"), ("t1", "OTHER"), ("t1T", "OKEN"), ("", "t1TOKEN")] {
            let moved = keys.open(tenant, name, &sealed).map(|_| ()).err();
            assert!(matches!(moved, Some(SealError::Forged { .. })), "opened as {tenant}/{name}: {moved:?}");
        }
        Ok(())
    }

    #[test]
    fn every_seal_has_its_own_nonce_and_any_altered_byte_is_refused() -> Result<(), SealError> {
        let keys = SealKeys::new(key(1)?, Vec::new());
        let (a, b) = (keys.seal("t", "N", "same")?, keys.seal("t", "N", "same")?);
        assert_ne!(a[1 + ID_BYTES..HEADER_BYTES], b[1 + ID_BYTES..HEADER_BYTES], "a nonce was reused");
        for index in 0..a.len() {
            let mut altered = a.clone();
            altered[index] ^= 0x01;
            assert!(keys.open("t", "N", &altered).is_err(), "byte {index} altered and it still opened");
        }
        assert!(matches!(keys.open("t", "N", &a[..HEADER_BYTES + 3]), Err(SealError::Malformed { .. })));
        assert!(matches!(keys.open("t", "N", b"plain text value of old rows"), Err(SealError::Malformed { .. })));
        Ok(())
    }

    #[test]
    fn previous_keys_open_and_only_the_current_one_seals() -> Result<(), SealError> {
        let old = SealKeys::new(key(1)?, Vec::new());
        let sealed_by_old = old.seal("t", "N", "v")?;
        let rotated = SealKeys::new(key(2)?, vec![key(1)?, key(2)?, key(1)?]);
        assert_eq!(rotated.previous_ids(), vec![key(1)?.id()], "duplicates are left out");
        assert_eq!(rotated.open("t", "N", &sealed_by_old)?, "v");
        assert!(!rotated.is_current(&sealed_by_old));
        let resealed = rotated.seal("t", "N", "v")?;
        assert!(rotated.is_current(&resealed));
        assert_eq!(key_id_of(&resealed), Some(key(2)?.id()));
        let unknown = old.open("t", "N", &resealed).map(|_| ()).err();
        assert!(matches!(unknown, Some(SealError::UnknownKey { key_id, .. }) if key_id == key(2)?.id()), "{unknown:?}");
        Ok(())
    }

    #[test]
    fn key_ids_differ_between_keys_and_show_no_key_material() -> Result<(), SealError> {
        let (a, b) = (key(1)?, key(2)?);
        assert_ne!(a.id(), b.id());
        assert_eq!(a.id(), key(1)?.id(), "the id is a function of the key");
        assert_eq!(a.id().to_string().len(), 8);
        assert_eq!(format!("{a:?}"), format!("SealKey({})", a.id()));
        let (generated, bytes) = SealKey::generate()?;
        assert_eq!(SealKey::from_bytes(&bytes)?.id(), generated.id());
        Ok(())
    }
}
