//! Command output on its way from the sandbox to the caller: which stream (`StreamKind`, also the host ↔ agent
//! protocol's `"stdout"`/`"stderr"`) and the bytes read from it (`OutputChunk`).

use serde::{Deserialize, Serialize};

/// Which output stream of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamKind {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl StreamKind {
    /// The stream's wire name: `"stdout"` or `"stderr"`.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamKind::Stdout => "stdout",
            StreamKind::Stderr => "stderr",
        }
    }
}

/// A piece of a running command's output, in the order it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputChunk {
    /// The stream it was read from.
    pub stream: StreamKind,
    /// The bytes, as read (not necessarily whole UTF-8 characters or lines).
    pub data: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_have_snake_case_wire_names() {
        for stream in [StreamKind::Stdout, StreamKind::Stderr] {
            let json = serde_json::to_string(&stream).unwrap_or_default();
            assert_eq!(json, format!("\"{}\"", stream.as_str()));
            assert_eq!(serde_json::from_str::<StreamKind>(&json).ok(), Some(stream));
        }
    }
}
