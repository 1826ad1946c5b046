//! Checks on client input that the types alone do not express: sandbox paths, environment variables, metadata,
//! snapshot names.
//! Each returns a message that says what to fix; the API turns it into a 400 or 422.

use std::collections::BTreeMap;

/// Longest accepted path, in bytes (Linux `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Most environment variables per sandbox or command.
pub const MAX_ENV_VARS: usize = 256;
/// Longest environment variable value, in bytes.
pub const MAX_ENV_VALUE_BYTES: usize = 32 << 10;
/// Most metadata entries per sandbox.
pub const MAX_METADATA_ENTRIES: usize = 64;
/// Longest metadata key, in bytes.
pub const MAX_METADATA_KEY_BYTES: usize = 64;
/// Longest metadata value, in bytes.
pub const MAX_METADATA_VALUE_BYTES: usize = 1024;
/// Longest snapshot name, in characters.
pub const MAX_SNAPSHOT_NAME_CHARS: usize = 128;

/// A path inside the sandbox: absolute, no NUL, no `..` component, at most 4096 bytes.
pub fn sandbox_path(what: &str, path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err(format!("{what} is empty: give an absolute path such as /workspace/file.txt"));
    }
    if !path.starts_with('/') {
        return Err(format!("{what} {path:?} is not absolute: start it with / (e.g. /workspace/{path})"));
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(format!("{what} is {} bytes long; the limit is {MAX_PATH_BYTES}", path.len()));
    }
    if path.contains('\0') {
        return Err(format!("{what} contains a NUL byte"));
    }
    if path.split('/').any(|component| component == "..") {
        return Err(format!("{what} {path:?} contains '..': give the path without it"));
    }
    Ok(())
}

/// Environment variables: POSIX names (`[A-Za-z_][A-Za-z0-9_]*`), values without NUL, bounded sizes.
pub fn environment(env: &BTreeMap<String, String>) -> Result<(), String> {
    if env.len() > MAX_ENV_VARS {
        return Err(format!("{} environment variables given; the limit is {MAX_ENV_VARS}", env.len()));
    }
    for (name, value) in env {
        let mut bytes = name.bytes();
        let valid = name.len() <= 256
            && bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid {
            return Err(format!(
                "environment variable name {name:?} is invalid: use letters, digits and '_', not starting with a digit"
            ));
        }
        if value.contains('\0') {
            return Err(format!("environment variable {name} contains a NUL byte"));
        }
        if value.len() > MAX_ENV_VALUE_BYTES {
            return Err(format!("environment variable {name} is longer than {MAX_ENV_VALUE_BYTES} bytes"));
        }
    }
    Ok(())
}

/// A command's argument vector: no NUL byte anywhere (it could not reach `execve` whole).
pub fn argv(argv: &[String]) -> Result<(), String> {
    if argv.iter().any(|arg| arg.contains('\0')) {
        return Err("the command contains a NUL byte".to_owned());
    }
    Ok(())
}

/// Metadata: at most 64 entries, keys of 1 to 64 bytes of `[A-Za-z0-9_.-]`, values up to 1024 bytes.
pub fn metadata(metadata: &BTreeMap<String, String>) -> Result<(), String> {
    if metadata.len() > MAX_METADATA_ENTRIES {
        return Err(format!("{} metadata entries given; the limit is {MAX_METADATA_ENTRIES}", metadata.len()));
    }
    for (key, value) in metadata {
        metadata_key(key)?;
        if value.len() > MAX_METADATA_VALUE_BYTES {
            return Err(format!("metadata value of {key:?} is longer than {MAX_METADATA_VALUE_BYTES} bytes"));
        }
    }
    Ok(())
}

/// One metadata key (also used for `metadata.KEY=value` list filters).
pub fn metadata_key(key: &str) -> Result<(), String> {
    let valid = (1..=MAX_METADATA_KEY_BYTES).contains(&key.len())
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(format!(
            "metadata key {key:?} is invalid: use 1 to {MAX_METADATA_KEY_BYTES} characters of A-Z, a-z, 0-9, '_', '.', '-'"
        ))
    }
}

/// A snapshot's name: at most 128 characters, none of them a control character.
pub fn snapshot_name(name: &str) -> Result<(), String> {
    if name.chars().count() > MAX_SNAPSHOT_NAME_CHARS || name.chars().any(char::is_control) {
        return Err(format!(
            "a snapshot name must be at most {MAX_SNAPSHOT_NAME_CHARS} characters without control characters"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_argv_with_a_nul_byte_is_refused() {
        assert!(argv(&["echo".into(), "fine".into()]).is_ok());
        assert!(argv(&["echo".into(), "a\0b".into()]).is_err_and(|e| e.contains("NUL")));
    }

    #[test]
    fn paths_must_be_absolute_short_and_clean() {
        assert!(sandbox_path("path", "/workspace/a.txt").is_ok());
        assert!(sandbox_path("path", "/").is_ok());
        assert!(sandbox_path("path", "/workspace/..hidden").is_ok());
        for bad in ["", "relative", "/a/../etc", "/..", "/a\0b"] {
            assert!(sandbox_path("path", bad).is_err(), "{bad:?}");
        }
        assert!(sandbox_path("path", &format!("/{}", "a".repeat(MAX_PATH_BYTES))).is_err());
    }

    #[test]
    fn env_names_follow_posix() {
        let env = |name: &str| BTreeMap::from([(name.to_owned(), "v".to_owned())]);
        assert!(environment(&env("PATH_2")).is_ok());
        assert!(environment(&env("_x")).is_ok());
        for bad in ["", "2X", "A-B", "A=B", "Ä"] {
            assert!(environment(&env(bad)).is_err(), "{bad:?}");
        }
        assert!(environment(&BTreeMap::from([("A".to_owned(), "a\0".to_owned())])).is_err());
    }

    #[test]
    fn metadata_is_bounded() {
        assert!(metadata(&BTreeMap::from([("owner.team".to_owned(), "x".to_owned())])).is_ok());
        assert!(metadata(&BTreeMap::from([("".to_owned(), "x".to_owned())])).is_err());
        assert!(metadata(&BTreeMap::from([("k".to_owned(), "x".repeat(1025))])).is_err());
        let many: BTreeMap<String, String> = (0..65).map(|i| (format!("k{i}"), String::new())).collect();
        assert!(metadata(&many).is_err());
    }
}
