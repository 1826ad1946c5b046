//! Sandbox ids: 16 random hex digits from the kernel's CSPRNG.

use crate::error::RuntimeError;

/// A new random sandbox id, e.g. `sb-3f9a0c27e1d4b658`.
pub fn new_sandbox_id() -> Result<String, RuntimeError> {
    let mut bytes = [0u8; 8];
    let mut filled = 0;
    while filled < bytes.len() {
        filled += rustix::rand::getrandom(&mut bytes[filled..], rustix::rand::GetRandomFlags::empty())
            .map_err(|e| RuntimeError::sys("getrandom", e))?;
    }
    Ok(format!("sb-{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_well_formed() {
        let a = new_sandbox_id().unwrap_or_default();
        let b = new_sandbox_id().unwrap_or_default();
        assert_ne!(a, b);
        assert_eq!(a.len(), 19);
        assert!(a.starts_with("sb-"));
    }
}
