//! Where the secrets keys come from, read once when `serve` starts (a missing or unusable configured key stops the
//! start there, with what to fix): `[secrets] key_file` or `key_env` (whose value may list previous keys after
//! commas), and `previous_key_files`. With neither `key_file` nor `key_env`, the key is the file
//! `<database>.secrets-key`, created at the first start (mode 0600, written whole under a temporary name and linked
//! into place, so it appears complete or not at all and never replaces one that exists).
//!
//! A key is 32 bytes written as 64 hex characters or as base64; surrounding whitespace is ignored. Errors name the
//! file or variable and the format expected, never the key's text.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use base64::Engine;
use zeroize::Zeroizing;

use super::{KEY_BYTES, SealError, SealKey, SealKeys};
use crate::config::SecretsConfig;

/// Largest key file read, in bytes (a key is 64 characters).
const MAX_FILE_BYTES: u64 = 4096;

/// Why the secrets keys could not be had.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// A key file could not be opened or read.
    #[error(
        "cannot read the secrets key file {path} ({setting}): {source}; a key file holds 32 random bytes as 64 hex \
         characters or base64 (e.g. `openssl rand -hex 32 > FILE && chmod 600 FILE`)"
    )]
    Read {
        /// The file.
        path: PathBuf,
        /// The setting that names it.
        setting: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// A key file may be read or written by its group or others.
    #[error("the secrets key file {path} has mode {mode:03o}, open to group or others: `chmod 600 {path}`")]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A key file is a directory, device or the like.
    #[error("the secrets key file {0} is not a regular file")]
    NotAFile(PathBuf),
    /// `key_env` names a variable that is not set.
    #[error(
        "[secrets] key_env = {0:?}, but that environment variable is not set or empty: set it to the key (32 bytes \
         as 64 hex characters or base64)"
    )]
    EnvMissing(String),
    /// A key's text is not 32 bytes in hex or base64.
    #[error("the secrets key in {origin} is unusable: {problem}")]
    Format {
        /// The file or variable.
        origin: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The default key file could not be created.
    #[error(
        "cannot create the secrets key file {path}: {source}; make its directory writable or configure [secrets] \
         key_file"
    )]
    Create {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// No randomness, or the cipher refused.
    #[error(transparent)]
    Seal(#[from] SealError),
}

/// The default key file of a database: `<database>.secrets-key`.
pub fn default_key_file(database: &Path) -> PathBuf {
    let mut path = database.as_os_str().to_owned();
    path.push(".secrets-key");
    PathBuf::from(path)
}

/// The keys `config` names (variables read from the process environment), or the default key file of `database`.
pub fn load(config: &SecretsConfig, database: &Path) -> Result<SealKeys, KeyError> {
    load_with(config, database, |name| std::env::var(name).ok())
}

/// As [`load`], with environment variables read through `env`.
pub fn load_with(
    config: &SecretsConfig,
    database: &Path,
    env: impl Fn(&str) -> Option<String>,
) -> Result<SealKeys, KeyError> {
    let mut previous = Vec::new();
    let current = match (&config.key_file, &config.key_env) {
        (Some(path), _) => read_file(path, "[secrets] key_file")?,
        (None, Some(name)) => {
            let value = Zeroizing::new(env(name).unwrap_or_default());
            let mut keys = value.split(',').map(str::trim).filter(|text| !text.is_empty()).enumerate();
            let (_, first) = keys.next().ok_or_else(|| KeyError::EnvMissing(name.clone()))?;
            for (index, text) in keys {
                previous.push(parse_key(text, || format!("environment variable {name} (key {})", index + 1))?);
            }
            parse_key(first, || format!("environment variable {name}"))?
        }
        (None, None) => default_key(&default_key_file(database))?,
    };
    for path in &config.previous_key_files {
        previous.push(read_file(path, "[secrets] previous_key_files")?);
    }
    let keys = SealKeys::new(current, previous);
    tracing::info!(key = %keys.current_id(), previous = ?keys.previous_ids(), "secrets keys loaded");
    Ok(keys)
}

/// Parses a key's text: 64 hex characters, or base64 (standard or URL-safe alphabet, padded or not) of 32 bytes.
fn parse_key(text: &str, origin: impl Fn() -> String) -> Result<SealKey, KeyError> {
    let problem = |problem: String| KeyError::Format { origin: origin(), problem };
    let text = text.trim();
    let mut bytes = Zeroizing::new([0u8; KEY_BYTES]);
    if text.is_empty() {
        return Err(problem("it is empty; a key is 32 bytes as 64 hex digits or as base64 (44 characters)".into()));
    }
    // Base64 of 32 bytes (43 or 44 characters) is never all hex digits but by a chance of about 2^-66.
    if text.bytes().all(|b| b.is_ascii_hexdigit()) {
        if text.len() != 2 * KEY_BYTES {
            return Err(problem(format!("{} hex digits; a hex key is 64 hex digits (32 bytes)", text.len())));
        }
        for (byte, pair) in bytes.iter_mut().zip(text.as_bytes().chunks_exact(2)) {
            *byte = (hex_digit(pair[0]) << 4) | hex_digit(pair[1]);
        }
        return Ok(SealKey::from_bytes(&bytes)?);
    }
    let engines = [
        base64::engine::general_purpose::STANDARD,
        base64::engine::general_purpose::STANDARD_NO_PAD,
        base64::engine::general_purpose::URL_SAFE,
        base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ];
    // The decoder's own errors are not shown: they quote the offending character of the key.
    let decoded = engines.iter().find_map(|engine| engine.decode(text).ok().map(Zeroizing::new)).ok_or_else(|| {
        problem(format!(
            "{} characters that are neither 64 hex digits nor base64; a key is 32 bytes as 64 hex digits or as \
             base64 (44 characters)",
            text.len()
        ))
    })?;
    if decoded.len() != KEY_BYTES {
        return Err(problem(format!(
            "base64 of {} bytes; a base64 key is 32 bytes (44 characters), e.g. from `openssl rand -base64 32`",
            decoded.len()
        )));
    }
    bytes.copy_from_slice(&decoded);
    Ok(SealKey::from_bytes(&bytes)?)
}

fn hex_digit(digit: u8) -> u8 {
    match digit {
        b'0'..=b'9' => digit - b'0',
        b'a'..=b'f' => digit - b'a' + 10,
        b'A'..=b'F' => digit - b'A' + 10,
        _ => 0,
    }
}

/// Reads a key file, refusing one that group or others may read or write.
fn read_file(path: &Path, setting: &'static str) -> Result<SealKey, KeyError> {
    let read_error = |source| KeyError::Read { path: path.to_owned(), setting, source };
    let file = File::open(path).map_err(read_error)?;
    // The checks look at the opened file (fstat), not the path: nothing can be swapped in between.
    let metadata = file.metadata().map_err(read_error)?;
    if !metadata.is_file() {
        return Err(KeyError::NotAFile(path.to_owned()));
    }
    let mode = metadata.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyError::Permissions { path: path.to_owned(), mode });
    }
    let mut text = Zeroizing::new(String::new());
    file.take(MAX_FILE_BYTES).read_to_string(&mut text).map_err(read_error)?;
    parse_key(&text, || format!("file {}", path.display()))
}

/// The default key file's key; the file is created with a new random key when it does not exist.
fn default_key(path: &Path) -> Result<SealKey, KeyError> {
    match read_file(path, "the default key file, next to the database") {
        Err(KeyError::Read { source, .. }) if source.kind() == ErrorKind::NotFound => {}
        found => return found,
    }
    match create(path) {
        Ok(key) => {
            tracing::warn!(
                path = %path.display(),
                key = %key.id(),
                "created the secrets key next to the database: keep a copy somewhere else (a backup holding the \
                 database and this file opens every secret; one without the file opens none), or configure \
                 [secrets] key_file"
            );
            Ok(key)
        }
        // Another start created it first: use that one.
        Err(KeyError::Create { source, .. }) if source.kind() == ErrorKind::AlreadyExists => {
            read_file(path, "the default key file, next to the database")
        }
        Err(error) => Err(error),
    }
}

/// Creates `path` holding a new random key (hex): written and synced under a temporary name, then hard-linked into
/// place, which fails when `path` exists.
fn create(path: &Path) -> Result<SealKey, KeyError> {
    let create_error = |source| KeyError::Create { path: path.to_owned(), source };
    let directory = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(directory).map_err(create_error)?;
    let (key, bytes) = SealKey::generate()?;
    let mut text = Zeroizing::new(String::with_capacity(2 * KEY_BYTES + 1));
    for byte in bytes.iter() {
        text.push_str(&format!("{byte:02x}"));
    }
    text.push('\n');
    let suffix = crate::ids::random_hex(8).map_err(|e| create_error(std::io::Error::other(e.to_string())))?;
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(format!(".{suffix}.tmp"));
    let temporary = PathBuf::from(temporary);
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temporary)
        .and_then(|mut file| file.write_all(text.as_bytes()).and_then(|()| file.sync_all()))
        .and_then(|()| std::fs::hard_link(&temporary, path));
    // The temporary name goes whether or not the link was made (the key lives on under `path` when it was).
    let _ = std::fs::remove_file(&temporary);
    written.map_err(create_error)?;
    File::open(directory).and_then(|dir| dir.sync_all()).map_err(create_error)?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    const HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    fn key_file(dir: &Path, name: &str, text: &str, mode: u32) -> Result<PathBuf, std::io::Error> {
        let path = dir.join(name);
        std::fs::write(&path, text)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        Ok(path)
    }

    fn message(result: Result<SealKeys, KeyError>) -> String {
        result.map(|_| ()).err().map(|e| e.to_string()).unwrap_or_default()
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn hex_and_base64_give_the_same_key_and_bad_text_says_which_format() -> Result<(), Box<dyn std::error::Error>> {
        let id = parse_key(HEX, String::new)?.id();
        let base64 = base64::engine::general_purpose::STANDARD.encode((0u8..32).collect::<Vec<_>>());
        for text in [HEX.to_owned(), HEX.to_uppercase(), format!("  {HEX}\n"), base64.clone(), base64.replace('=', "")]
        {
            assert_eq!(parse_key(&text, String::new)?.id(), id, "{text:?}");
        }
        let short_hex = &HEX[..62];
        let short_base64 = base64::engine::general_purpose::STANDARD.encode([7u8; 16]);
        let secret_looking = "not a key but a sentence: p4ssw0rd!";
        let cases = [(short_hex, "62 hex digits; a hex key is 64 hex digits"), (&short_base64, "base64 of 16 bytes")];
        for (text, expected) in cases.into_iter().chain([(secret_looking, "neither 64 hex digits nor base64")]) {
            let problem = parse_key(text, || "file /k".to_owned()).map(|_| ()).err().map(|e| e.to_string());
            let problem = problem.unwrap_or_default();
            assert!(problem.contains(expected) && problem.contains("file /k"), "{text:?}: {problem}");
            assert!(!problem.contains(text.trim()), "the key's text is in the error: {problem}");
        }
        Ok(())
    }

    #[test]
    fn a_key_file_open_to_group_or_others_is_refused() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        for mode in [0o640, 0o604, 0o660, 0o606] {
            let path = key_file(dir.path(), "k", HEX, mode)?;
            let config = SecretsConfig { key_file: Some(path.clone()), ..SecretsConfig::default() };
            let error = message(load_with(&config, &dir.path().join("db"), no_env));
            assert!(error.contains(&format!("mode {mode:03o}")) && error.contains("chmod 600"), "{error}");
        }
        let path = key_file(dir.path(), "k", HEX, 0o400)?;
        let config = SecretsConfig { key_file: Some(path), ..SecretsConfig::default() };
        assert_eq!(load_with(&config, &dir.path().join("db"), no_env)?.current_id(), parse_key(HEX, String::new)?.id());
        Ok(())
    }

    #[test]
    fn a_configured_key_that_is_missing_stops_the_start_naming_the_setting() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let database = dir.path().join("db");
        let missing = SecretsConfig { key_file: Some(dir.path().join("nope")), ..SecretsConfig::default() };
        let error = message(load_with(&missing, &database, no_env));
        assert!(error.contains("nope") && error.contains("[secrets] key_file"), "{error}");
        let unset = SecretsConfig { key_env: Some("SK_TEST_KEY".into()), ..SecretsConfig::default() };
        let error = message(load_with(&unset, &database, no_env));
        assert!(error.contains("SK_TEST_KEY") && error.contains("not set"), "{error}");
        let error = message(load_with(&unset, &database, |_| Some("abc".into())));
        assert!(error.contains("environment variable SK_TEST_KEY"), "{error}");
        assert!(!default_key_file(&database).exists(), "a configured key never falls back to the default file");
        Ok(())
    }

    #[test]
    fn the_variable_may_list_previous_keys_after_the_current_one() -> Result<(), Box<dyn std::error::Error>> {
        let old = base64::engine::general_purpose::STANDARD.encode([9u8; 32]);
        let config = SecretsConfig { key_env: Some("K".into()), ..SecretsConfig::default() };
        let keys =
            load_with(&config, Path::new("/nonexistent/db"), |name| (name == "K").then(|| format!("{HEX}, {old}")))?;
        assert_eq!(keys.current_id(), parse_key(HEX, String::new)?.id());
        assert_eq!(keys.previous_ids(), vec![parse_key(&old, String::new)?.id()]);
        Ok(())
    }

    #[test]
    fn the_default_key_file_is_created_once_with_mode_0600_and_reused() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let database = dir.path().join("state/sandkasten.db");
        let first = load_with(&SecretsConfig::default(), &database, no_env)?;
        let path = dir.path().join("state/sandkasten.db.secrets-key");
        let metadata = std::fs::metadata(&path)?;
        assert_eq!(metadata.mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_to_string(&path)?.trim().len(), 64);
        let second = load_with(&SecretsConfig::default(), &database, no_env)?;
        assert_eq!(first.current_id(), second.current_id(), "the second start made a new key");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("state"))?.collect::<Result<_, _>>()?;
        assert_eq!(leftovers.len(), 1, "temporary files were left: {leftovers:?}");
        assert!(matches!(create(&path), Err(KeyError::Create { .. })), "an existing key file was replaced");
        assert_eq!(load_with(&SecretsConfig::default(), &database, no_env)?.current_id(), first.current_id());
        Ok(())
    }
}
