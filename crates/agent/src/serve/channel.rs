//! The agent's end of the host channel in serve mode: non-blocking, with an incremental frame decoder for requests
//! and an outgoing queue for replies, so neither a slow host nor a chatty command ever blocks the loop. The queue's
//! size drives backpressure: above `HIGH_WATER_BYTES` the loop stops reading commands' output and new requests
//! until the host has taken some.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use sandkasten_protocol::{Envelope, FrameDecoder, Message, ProtocolError, encode};
use sandkasten_types::{Failure, FailureKind};

use super::errors::ServeError;

/// Queued outgoing bytes above which the loop stops producing more.
pub const HIGH_WATER_BYTES: usize = 4 << 20;

const READ_CHUNK: usize = 64 << 10;

/// What a read from the host produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Received {
    /// Bytes were added to the decoder (or nothing was ready).
    More,
    /// The host closed its end (or the transport failed): it is gone.
    Closed,
}

/// The non-blocking channel with its decoder and outgoing queue.
pub struct Channel {
    stream: UnixStream,
    decoder: FrameDecoder,
    outgoing: Vec<u8>,
    sent: usize,
    broken: bool,
}

impl Channel {
    /// Switches `stream` to non-blocking mode.
    pub fn new(stream: UnixStream) -> Result<Channel, ServeError> {
        stream.set_nonblocking(true).map_err(ServeError::Channel)?;
        Ok(Channel { stream, decoder: FrameDecoder::new(), outgoing: Vec::new(), sent: 0, broken: false })
    }

    /// The descriptor to poll.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }

    /// Bytes queued and not yet written.
    pub fn queued(&self) -> usize {
        self.outgoing.len() - self.sent
    }

    /// True above the high-water mark: produce nothing more until the host reads.
    pub fn congested(&self) -> bool {
        self.queued() > HIGH_WATER_BYTES
    }

    /// True once a write failed (the host is gone).
    pub fn broken(&self) -> bool {
        self.broken
    }

    /// Queues one message. A reply too large for a frame becomes a `Failed` (`too_large`) reply instead.
    pub fn queue(&mut self, id: u64, msg: Message) {
        let frame = match encode(&Envelope::new(id, msg)) {
            Ok(frame) => frame,
            Err(error) => {
                let kind = match error {
                    ProtocolError::FrameTooLarge(_) => FailureKind::TooLarge,
                    _ => FailureKind::Internal,
                };
                let failed = Message::Failed(Failure::new(kind, format!("the reply could not be sent: {error}")));
                match encode(&Envelope::new(id, failed)) {
                    Ok(frame) => frame,
                    Err(_) => return,
                }
            }
        };
        self.outgoing.extend_from_slice(&frame);
    }

    /// Writes as much of the queue as the socket takes now.
    pub fn flush(&mut self) {
        while self.queued() > 0 && !self.broken {
            match self.stream.write(&self.outgoing[self.sent..]) {
                Ok(0) => self.broken = true,
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => self.broken = true,
            }
        }
        if self.sent == self.outgoing.len() {
            self.outgoing.clear();
            self.sent = 0;
        } else if self.sent > (1 << 20) && self.sent * 2 > self.outgoing.len() {
            self.outgoing.drain(..self.sent);
            self.sent = 0;
        }
    }

    /// Waits up to `timeout_ms` for the queue to be written (before exiting).
    pub fn flush_for(&mut self, timeout_ms: u64) {
        let give_up = sandkasten_protocol::monotonic_ns().saturating_add(timeout_ms.saturating_mul(1_000_000));
        loop {
            self.flush();
            let now = sandkasten_protocol::monotonic_ns();
            if self.queued() == 0 || self.broken || now >= give_up {
                return;
            }
            let left = give_up - now;
            let timeout = Timespec { tv_sec: (left / 1_000_000_000) as i64, tv_nsec: (left % 1_000_000_000) as i64 };
            let mut fds = [PollFd::new(&self.stream, PollFlags::OUT)];
            let _ = poll(&mut fds, Some(&timeout));
        }
    }

    /// Reads what the host sent.
    pub fn receive(&mut self) -> Received {
        let mut buffer = [0u8; READ_CHUNK];
        match self.stream.read(&mut buffer) {
            Ok(0) => Received::Closed,
            Ok(n) => {
                self.decoder.push(&buffer[..n]);
                Received::More
            }
            Err(e) if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::WouldBlock) => Received::More,
            Err(_) => Received::Closed,
        }
    }

    /// The next complete request, if one is buffered.
    pub fn next_request(&mut self) -> Result<Option<Envelope>, ProtocolError> {
        self.decoder.next_envelope()
    }
}
