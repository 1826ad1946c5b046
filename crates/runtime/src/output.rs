//! Output capture: each stream is kept up to the output limit; live chunks also go to a sink (the CLI's terminal).

use sandkasten_types::{OutputStream, StreamKind};

/// Receives output as it is produced (only the bytes within the limit).
pub trait OutputSink {
    /// A chunk of one stream.
    fn chunk(&mut self, stream: StreamKind, bytes: &[u8]);
}

/// A sink that keeps nothing (the result still carries the captured output).
pub struct DiscardOutput;

impl OutputSink for DiscardOutput {
    fn chunk(&mut self, _stream: StreamKind, _bytes: &[u8]) {}
}

/// One stream being captured, with its cap.
#[derive(Debug)]
pub(crate) struct Capture {
    pub(crate) stream: OutputStream,
    limit: usize,
}

impl Capture {
    pub(crate) fn new(limit: u64) -> Self {
        Capture { stream: OutputStream::default(), limit: usize::try_from(limit).unwrap_or(usize::MAX) }
    }

    /// Keeps what fits; returns the part kept and whether the limit was exceeded.
    pub(crate) fn append<'a>(&mut self, bytes: &'a [u8]) -> (&'a [u8], bool) {
        let room = self.limit.saturating_sub(self.stream.bytes.len());
        let kept = &bytes[..bytes.len().min(room)];
        self.stream.bytes.extend_from_slice(kept);
        if kept.len() < bytes.len() {
            self.stream.truncated = true;
        }
        (kept, self.stream.truncated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_keeps_exactly_the_limit() {
        let mut capture = Capture::new(5);
        assert_eq!(capture.append(b"abc"), (&b"abc"[..], false));
        assert_eq!(capture.append(b"defg"), (&b"de"[..], true));
        assert_eq!(capture.stream.bytes, b"abcde");
        assert!(capture.stream.truncated);
    }
}
