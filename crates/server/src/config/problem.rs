//! What is wrong with a config: one [`Problem`] per thing, at its key path (`tenants[2].max_memory_bytes`) and,
//! when the config came from a file, at its line and column; [`Problems`] is all of them, which `sandkasten config
//! check` and `sandkasten serve` print alike; [`ConfigError`] is a config that cannot be used.

use std::fmt;
use std::path::PathBuf;

use serde::Serialize;
use thiserror::Error;

/// One thing wrong with a config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// Where: the key path (`listen`, `tenants[2].api_keys[0]`, `egress.hosts."bad host"`); empty for the file as a
    /// whole (a TOML syntax error).
    pub path: String,
    /// What is wrong, and what to write instead.
    pub message: String,
    /// Line in the file, from 1, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    /// Column in the file (characters, from 1), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<usize>,
}

impl Problem {
    /// A problem at `path`, not yet placed in a file.
    pub fn new(path: impl Into<String>, message: impl fmt::Display) -> Problem {
        Problem { path: path.into(), message: message.to_string(), line: None, column: None }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let (Some(line), Some(column)) = (self.line, self.column) {
            write!(f, "{line}:{column}: ")?;
        }
        match self.path.is_empty() {
            true => f.write_str(&self.message),
            false => write!(f, "{}: {}", self.path, self.message),
        }
    }
}

/// Every problem of a config, with the file it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problems {
    /// The config file, if the config came from one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    /// The problems, in the order of the file (those without a line last).
    pub problems: Vec<Problem>,
}

impl Problems {
    /// Problems of a config that came from no file.
    pub fn new(problems: Vec<Problem>) -> Problems {
        Problems { file: None, problems }
    }
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.problems.len();
        let file = self.file.as_ref().map(|file| file.display().to_string());
        let noun = if count == 1 { "problem" } else { "problems" };
        match &file {
            Some(file) => write!(f, "config file {file}: {count} {noun}")?,
            None => write!(f, "config: {count} {noun}")?,
        }
        for problem in &self.problems {
            f.write_str("\n  ")?;
            if let Some(file) = &file {
                f.write_str(file)?;
                f.write_str(if problem.line.is_some() { ":" } else { ": " })?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

/// A configuration that cannot be used: the file could not be read, or every problem found in it.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The config has problems: each with its key path, and its line and column when it came from a file.
    #[error("{0}")]
    Invalid(Problems),
}

impl ConfigError {
    /// One problem at `path` (a check made once the server starts: a tier this host cannot run, a store that cannot
    /// be opened).
    pub fn at(path: impl Into<String>, message: impl fmt::Display) -> ConfigError {
        ConfigError::Invalid(Problems::new(vec![Problem::new(path, message)]))
    }

    /// The problems, if that is what this is.
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Invalid(problems) => &problems.problems,
            ConfigError::Read { .. } => &[],
        }
    }
}

/// Collects problems as a check walks a config.
#[derive(Debug, Default)]
pub(crate) struct Found(pub(crate) Vec<Problem>);

impl Found {
    /// Records a problem at `path`.
    pub(crate) fn add(&mut self, path: impl Into<String>, message: impl fmt::Display) {
        self.0.push(Problem::new(path, message));
    }

    /// Records a problem at `path` when `message` is some.
    pub(crate) fn check(&mut self, path: impl Into<String>, message: Option<String>) {
        if let Some(message) = message {
            self.add(path, message);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_print_one_a_line_with_file_line_column_and_path() {
        let mut located = Problem::new("pools[0].isolation", "unknown tier \"gvisr\"");
        (located.line, located.column) = (Some(7), Some(13));
        let problems = Problems {
            file: Some("s.toml".into()),
            problems: vec![located, Problem::new("tenants", "no API keys"), Problem::new("", "bad TOML")],
        };
        assert_eq!(
            problems.to_string(),
            "config file s.toml: 3 problems\n  s.toml:7:13: pools[0].isolation: unknown tier \"gvisr\"\n  \
             s.toml: tenants: no API keys\n  s.toml: bad TOML"
        );
    }
}
