//! The crate's errors: a spec's problems (each naming its field or line and how to fix it) and the template cache's.

use std::path::PathBuf;

/// A problem with a template spec or Dockerfile: nothing was built.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// A field whose value is wrong.
    #[error("{field}: {message}")]
    Field {
        /// The field's path, e.g. `packages.pip[0]`.
        field: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The TOML does not parse or does not fit the spec's shape (unknown key, wrong type, missing field).
    #[error("{}line {line}, column {column}: {message}", field_prefix(.field))]
    Toml {
        /// The field's path where known (empty at the top level).
        field: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// A Dockerfile line this subset cannot translate.
    #[error("Dockerfile line {line}: {message}")]
    Dockerfile {
        /// 1-based line of the instruction.
        line: usize,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The spec file (or a file it names) could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

fn field_prefix(field: &str) -> String {
    if field.is_empty() { String::new() } else { format!("{field}: ") }
}

impl SpecError {
    /// A problem with `field`.
    pub fn at(field: impl Into<String>, message: impl Into<String>) -> SpecError {
        SpecError::Field { field: field.into(), message: message.into() }
    }

    /// A TOML error at `field`, located in `text`.
    pub(crate) fn toml(text: &str, field: &str, error: &toml::de::Error) -> SpecError {
        let offset = error.span().map(|span| span.start).unwrap_or(0).min(text.len());
        let before = &text[..offset];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) + 1;
        let mut message = error.message().trim_end().to_owned();
        if message.starts_with("unknown field") {
            message.push_str(": remove the key or fix its spelling");
        }
        SpecError::Toml { field: field.to_owned(), line, column, message }
    }

    /// The field the problem is in, where it has one (the unknown key's table for an unknown key).
    pub fn field(&self) -> Option<&str> {
        match self {
            SpecError::Field { field, .. } => Some(field),
            SpecError::Toml { field, .. } => Some(field),
            _ => None,
        }
    }
}

/// A failure of the template cache or of packing and unpacking layers.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A filesystem operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done (`reading`, `creating`, ...).
        action: &'static str,
        /// On which path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A template or layer record does not parse.
    #[error("{path}: {message}")]
    Corrupt {
        /// The record.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A layer archive holds an entry that may not be unpacked (absolute, `..`, a device other than a whiteout).
    #[error("layer entry {entry:?}: {reason}")]
    BadEntry {
        /// The entry's path.
        entry: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// The cache cannot be used where it is.
    #[error("the template cache: {0}")]
    Unusable(String),
    /// No template of that name.
    #[error("no template named {0:?}: `sandkasten template list` shows the templates")]
    UnknownTemplate(String),
}

impl CacheError {
    /// An I/O failure of `action` on `path`.
    pub fn io(action: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> CacheError {
        let path = path.into();
        move |source| CacheError::Io { action, path, source }
    }
}
