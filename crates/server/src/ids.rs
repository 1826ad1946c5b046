//! Identifiers the server hands out: `sb-` + 16 hex digits for sandboxes, `cmd-` + 16 hex digits for commands, from
//! the kernel's random pool (unguessable, so an id alone reveals nothing about other sandboxes).

use std::io::Read;

/// The random pool could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read /dev/urandom: {0}")]
pub struct IdError(#[from] std::io::Error);

/// `bytes` random bytes from the kernel's pool, as lowercase hex (ids, access tokens, secret placeholders).
pub(crate) fn random_hex(bytes: usize) -> Result<String, IdError> {
    let mut buffer = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buffer)?;
    Ok(buffer.iter().map(|b| format!("{b:02x}")).collect())
}

/// A new sandbox id.
pub fn sandbox_id() -> Result<String, IdError> {
    Ok(format!("sb-{}", random_hex(8)?))
}

/// A new command id.
pub fn command_id() -> Result<String, IdError> {
    Ok(format!("cmd-{}", random_hex(8)?))
}

/// A new snapshot id.
pub fn snapshot_id() -> Result<String, IdError> {
    Ok(format!("sn-{}", random_hex(8)?))
}

/// True for strings shaped like a snapshot id; anything else cannot exist.
pub fn is_snapshot_id(text: &str) -> bool {
    text.len() == 19
        && text.starts_with("sn-")
        && text.bytes().skip(3).all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// True for strings shaped like a sandbox id; anything else cannot exist and is answered with 404 at once.
pub fn is_sandbox_id(text: &str) -> bool {
    text.len() == 19
        && text.starts_with("sb-")
        && text.bytes().skip(3).all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// True for strings shaped like a command id; anything else cannot exist.
pub fn is_command_id(text: &str) -> bool {
    text.len() == 20
        && text.starts_with("cmd-")
        && text.bytes().skip(4).all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_well_formed_and_distinct() -> Result<(), IdError> {
        let (a, b) = (sandbox_id()?, sandbox_id()?);
        assert!(is_sandbox_id(&a) && is_sandbox_id(&b), "{a} {b}");
        assert_ne!(a, b);
        assert!(is_command_id(&command_id()?));
        assert!(!is_command_id("cmd-../../../etc/pw"));
        assert!(!is_sandbox_id("sb-0123456789ABCDEF"));
        assert!(!is_sandbox_id("sb-../../etc/passwd"));
        Ok(())
    }
}
