//! Copying the owner's standard input into the program's stdin pipe. The program never receives the owner's own
//! descriptor: with it, it could write to the file or terminal behind it, change terminal settings, or move the
//! owner's read position (`lseek`) under a shell loop that reads the same file.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::event::PollFlags;

use crate::error::RuntimeError;

const CHUNK: usize = 64 << 10;

/// A one-way copy from `source` (blocking reads, only when poll says readable) into `sink` (non-blocking writes).
pub(crate) struct StdinPump {
    source: Option<File>,
    sink: Option<File>,
    pending: Vec<u8>,
    written: usize,
}

impl StdinPump {
    /// Pumps `source` into `sink` (the write end of the program's stdin pipe).
    pub(crate) fn new(source: OwnedFd, sink: OwnedFd) -> Result<StdinPump, RuntimeError> {
        rustix::io::ioctl_fionbio(&sink, true).map_err(|e| RuntimeError::sys("fionbio on the stdin pipe", e))?;
        Ok(StdinPump {
            source: Some(File::from(source)),
            sink: Some(File::from(sink)),
            pending: Vec::new(),
            written: 0,
        })
    }

    /// The descriptor to wait on next: the source while nothing is pending, else the sink; `None` when done.
    pub(crate) fn interest(&self) -> Option<(BorrowedFd<'_>, PollFlags)> {
        let sink = self.sink.as_ref()?;
        if self.written < self.pending.len() {
            return Some((sink.as_fd(), PollFlags::OUT));
        }
        self.source.as_ref().map(|source| (source.as_fd(), PollFlags::IN))
    }

    /// Makes progress after poll reported the descriptor from `interest` ready.
    pub(crate) fn on_ready(&mut self) {
        if self.written < self.pending.len() {
            self.write_pending();
            return;
        }
        let Some(source) = self.source.as_mut() else { return };
        let mut buffer = vec![0u8; CHUNK];
        match source.read(&mut buffer) {
            Ok(0) | Err(_) => {
                // End of the owner's input: the program sees end-of-file once the pipe is closed.
                self.source = None;
                self.sink = None;
            }
            Ok(n) => {
                self.pending = buffer[..n].to_vec();
                self.written = 0;
                self.write_pending();
            }
        }
    }

    fn write_pending(&mut self) {
        let Some(sink) = self.sink.as_mut() else { return };
        match sink.write(&self.pending[self.written..]) {
            Ok(n) => self.written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                // The program closed its stdin (EPIPE): stop copying.
                self.source = None;
                self.sink = None;
            }
        }
    }
}
