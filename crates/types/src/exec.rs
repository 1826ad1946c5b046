//! What to run inside a sandbox: a program with arguments, or source code in one of the supported languages.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A language whose source code sandkasten knows how to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Language {
    /// CPython 3 (`/usr/bin/python3`).
    Python,
    /// Node.js (`/usr/bin/node`).
    Node,
    /// GNU bash.
    Bash,
    /// C, compiled with gcc inside the sandbox, then run.
    C,
}

impl Language {
    /// Every supported language, for help texts and error messages.
    pub const ALL: [Language; 4] = [Language::Python, Language::Node, Language::Bash, Language::C];

    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Node => "node",
            Language::Bash => "bash",
            Language::C => "c",
        }
    }

    /// Parses a language name; a few common aliases are accepted.
    pub fn from_name(name: &str) -> Option<Language> {
        match name.to_ascii_lowercase().as_str() {
            "python" | "python3" | "py" => Some(Language::Python),
            "node" | "nodejs" | "javascript" | "js" => Some(Language::Node),
            "bash" | "sh" | "shell" => Some(Language::Bash),
            "c" | "gcc" => Some(Language::C),
            _ => None,
        }
    }

    /// The file name the source is stored under inside the sandbox.
    pub fn source_file_name(self) -> &'static str {
        match self {
            Language::Python => "main.py",
            Language::Node => "main.js",
            Language::Bash => "main.sh",
            Language::C => "main.c",
        }
    }
}

/// What one execution runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    /// A program and its arguments, looked up on the sandbox's PATH.
    Argv(Vec<String>),
    /// Source code in a language.
    Code {
        /// The language.
        language: Language,
        /// The source text.
        code: String,
    },
}

/// A file placed in the sandbox before the command runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Upload {
    /// Absolute path inside the sandbox, under `/workspace` or `/tmp`.
    pub path: String,
    /// The file's contents.
    #[serde(with = "crate::result::base64_bytes")]
    #[schemars(with = "String")]
    pub contents: Vec<u8>,
    /// Permission bits (e.g. 0o644).
    pub mode: u32,
}

/// One execution inside a sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ExecRequest {
    /// What to run.
    pub command: Command,
    /// Extra environment for this execution (on top of the sandbox's).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Files written into the sandbox before the command starts.
    #[serde(default)]
    pub uploads: Vec<Upload>,
}
