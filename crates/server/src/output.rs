//! Output of a running command as a runtime hands it to the server: which stream, which bytes, in the order read.

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// A piece of a running command's output, in the order the runtime read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputChunk {
    /// The stream it was read from.
    pub stream: Stream,
    /// The bytes, as read (not necessarily whole UTF-8 characters or lines).
    pub data: Vec<u8>,
}
