//! What a kernel writes on its stdout: one JSON message per line (`ready`, `stream`, `reply`). The kernel runs inside
//! the sandbox, so every line is untrusted: lines are length-capped, and a line that is not a known message is the
//! cell's own output (e.g. a child process that wrote to the inherited descriptor).

use sandkasten_types::{CellError, CellResult};
use serde::Deserialize;

/// Longest line kept (a reply with a large figure or table); longer lines are dropped.
pub const MAX_LINE_BYTES: usize = 32 << 20;

/// A kernel's reply to one cell.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Reply {
    /// The request's id.
    pub id: Option<u64>,
    /// The kernel's cell counter.
    pub execution_count: u64,
    /// Rich results.
    #[serde(default)]
    pub results: Vec<CellResult>,
    /// The cell's error.
    #[serde(default)]
    pub error: Option<CellError>,
}

/// One message of a kernel.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KernelMessage {
    /// The kernel is ready for requests.
    Ready {},
    /// Output of the running cell.
    Stream {
        /// `stdout` or `stderr`.
        name: String,
        /// The text.
        text: String,
    },
    /// The end of a cell.
    Reply(Reply),
}

/// A line of the kernel's stdout, interpreted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// A protocol message.
    Message(KernelMessage),
    /// Anything else: output written around the kernel (the line, with its newline).
    Raw(String),
    /// A line longer than `MAX_LINE_BYTES` (dropped).
    Oversized,
}

/// Splits a byte stream into lines.
#[derive(Debug, Default)]
pub struct LineSplitter {
    buffer: Vec<u8>,
    skipping: bool,
}

impl LineSplitter {
    /// Adds bytes; returns the lines they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Line> {
        let mut lines = Vec::new();
        for piece in bytes.split_inclusive(|&b| b == b'\n') {
            let complete = piece.last() == Some(&b'\n');
            if !self.skipping {
                self.buffer.extend_from_slice(piece);
                if self.buffer.len() > MAX_LINE_BYTES {
                    self.buffer = Vec::new();
                    self.skipping = true;
                }
            }
            if complete {
                if self.skipping {
                    self.skipping = false;
                    lines.push(Line::Oversized);
                } else {
                    lines.push(parse(&std::mem::take(&mut self.buffer)));
                }
            }
        }
        lines
    }
}

fn parse(line: &[u8]) -> Line {
    let text = String::from_utf8_lossy(line);
    let trimmed = text.trim_end_matches(['\n', '\r']);
    if trimmed.starts_with('{')
        && let Ok(message) = serde_json::from_str::<KernelMessage>(trimmed)
    {
        return Line::Message(message);
    }
    Line::Raw(text.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_raw_lines_and_partial_input() {
        let mut splitter = LineSplitter::default();
        assert!(splitter.push(b"{\"type\":\"ready\",\"language\":\"python\"").is_empty());
        assert_eq!(
            splitter.push(b"}\nhello\n"),
            vec![Line::Message(KernelMessage::Ready {}), Line::Raw("hello\n".into())]
        );
        let reply = br#"{"type":"reply","id":3,"execution_count":2,"results":[{"text/plain":"42","is_main_result":true}],"error":null}"#;
        let lines = splitter.push(&[reply.as_slice(), b"\n"].concat());
        let Line::Message(KernelMessage::Reply(reply)) = &lines[0] else { panic!("{lines:?}") };
        assert_eq!(reply.id, Some(3));
        assert_eq!(reply.results[0].text_plain.as_deref(), Some("42"));
        assert_eq!(splitter.push(b"{\"type\":\"bogus\"}\n"), vec![Line::Raw("{\"type\":\"bogus\"}\n".into())]);
    }

    #[test]
    fn oversized_lines_are_dropped() {
        let mut splitter = LineSplitter::default();
        let big = vec![b'x'; MAX_LINE_BYTES + 10];
        assert!(splitter.push(&big).is_empty());
        assert_eq!(splitter.push(b"yy\nok\n"), vec![Line::Oversized, Line::Raw("ok\n".into())]);
    }
}
