//! What a tenant's secret may be, for both ways of writing one (`PUT /v1/secrets/{name}` and E2B's `/secrets`): how
//! many a tenant may hold, how long a value may be and what it may contain (it travels in HTTP headers), and the
//! bounds of caller metadata (E2B's: 32 entries, 128-byte keys, 1024-byte values, 8192 bytes in all). Each check
//! answers in words that name what is wrong; the callers wrap them in their API's error.

use crate::egress::store::SecretMetadata;

/// Most secrets one tenant may hold (every secret's value is opened for each sandbox that uses rules or secrets).
pub const MAX_SECRETS: usize = 256;
/// Longest secret value, in bytes.
pub const MAX_VALUE_BYTES: usize = 8 * 1024;
/// Most metadata entries per secret.
pub const MAX_METADATA_ENTRIES: usize = 32;
/// Longest metadata key, in bytes.
pub const MAX_METADATA_KEY_BYTES: usize = 128;
/// Longest metadata value, in bytes.
pub const MAX_METADATA_VALUE_BYTES: usize = 1024;
/// Most metadata bytes (keys and values) per secret.
pub const MAX_METADATA_BYTES: usize = 8192;

/// The value's problem, if it has one: 1 to [`MAX_VALUE_BYTES`] bytes without control characters.
pub fn value_problem(value: &str) -> Option<String> {
    if value.is_empty() || value.len() > MAX_VALUE_BYTES {
        return Some(format!("value must be 1 to {MAX_VALUE_BYTES} bytes"));
    }
    if value.chars().any(char::is_control) {
        return Some("value contains a control character; it must fit in an HTTP header".to_owned());
    }
    None
}

/// The metadata's problem, if it has one.
pub fn metadata_problem(metadata: &SecretMetadata) -> Option<String> {
    if metadata.len() > MAX_METADATA_ENTRIES {
        return Some(format!("metadata has {} entries, at most {MAX_METADATA_ENTRIES} are allowed", metadata.len()));
    }
    let mut total = 0usize;
    for (key, value) in metadata {
        if key.is_empty() || key.len() > MAX_METADATA_KEY_BYTES {
            return Some(format!("metadata key {key:?} must be 1 to {MAX_METADATA_KEY_BYTES} bytes"));
        }
        if value.len() > MAX_METADATA_VALUE_BYTES {
            return Some(format!("metadata value of {key:?} exceeds {MAX_METADATA_VALUE_BYTES} bytes"));
        }
        total += key.len() + value.len();
    }
    (total > MAX_METADATA_BYTES).then(|| format!("metadata is {total} bytes, at most {MAX_METADATA_BYTES} in all"))
}

/// What the tenant is told when it holds [`MAX_SECRETS`] already.
pub fn too_many() -> String {
    format!("this tenant holds {MAX_SECRETS} secrets, the most it may: delete one first")
}

/// E2B's name of a secret as stored (lowercased, as E2B stores names), or what is wrong with it: 1 to 128 bytes of
/// lowercase letters, digits, `-`, `_` and `.` (it is spelled inside `${e2b.secrets.NAME}`), not starting with `sec_`
/// (E2B keeps that prefix for ids).
pub fn e2b_name(name: &str) -> Result<String, String> {
    let lower = name.to_ascii_lowercase();
    let usable = (1..=128).contains(&lower.len())
        && lower.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.'));
    if !usable {
        return Err(format!(
            "secret name {name:?} is invalid: use 1 to 128 letters, digits, '-', '_' and '.' (names are lowercased)"
        ));
    }
    if lower.starts_with("sec_") {
        return Err(format!("secret name {name:?} is invalid: the prefix sec_ is reserved for secret ids"));
    }
    Ok(lower)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2b_names_are_lowercased_and_bounded() {
        assert_eq!(e2b_name("OpenAI-API-Key").ok().as_deref(), Some("openai-api-key"));
        assert_eq!(e2b_name("a.b_c-1").ok().as_deref(), Some("a.b_c-1"));
        for bad in ["", "has space", "brace}", "sec_123", "SEC_x", &"x".repeat(129), "é"] {
            assert!(e2b_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn values_and_metadata_are_bounded() {
        assert!(value_problem("v").is_none());
        assert!(value_problem("").is_some());
        assert!(value_problem(&"v".repeat(MAX_VALUE_BYTES + 1)).is_some());
        assert!(value_problem("a\nb").is_some());
        let entries = |n: usize, key: usize, value: usize| -> SecretMetadata {
            (0..n).map(|i| (format!("{i:0key$}"), "v".repeat(value))).collect()
        };
        assert!(metadata_problem(&entries(32, 3, 10)).is_none());
        assert!(metadata_problem(&entries(33, 3, 1)).is_some_and(|m| m.contains("33 entries")));
        assert!(metadata_problem(&entries(1, 129, 1)).is_some());
        assert!(metadata_problem(&entries(1, 3, 1025)).is_some());
        assert!(metadata_problem(&entries(9, 3, 1000)).is_some_and(|m| m.contains("8192")));
        assert!(metadata_problem(&SecretMetadata::from([(String::new(), "v".to_owned())])).is_some());
    }
}
