//! The socket under an `AgentClient`, which a gVisor pause replaces. A checkpoint ends the sandbox's processes and
//! with them the agent's end of its channel; the restored agent serves on a new socket. The client switches over
//! without losing a route or a frame:
//! - before the checkpoint it *quiesces*: `Quiesce` (the agent closes its other connections to host sockets, which
//!   runsc cannot save) is the last thing written on the old socket, so once it is answered the agent has read every
//!   request sent before, and every later write waits (the writer is suspended) until the new socket is there;
//! - the reader reads the old socket to its end and goes on with the new one through the same decoder (a frame the
//!   agent had half written goes on where it stopped); the old socket's end is not the sandbox's end while a pause
//!   is in progress;
//! - after the restore, the first frame on the new socket is `Resumed` (the agent moves its deadlines on), then the
//!   waiting writes go out.
//!
//! A pause that fails before the sandbox stopped continues on the old socket (after `Resumed`, so the agent opens
//! its connections again); a sandbox that is destroyed while paused
//! or does not come back is closed: every waiting request and route learns that it is gone.

use std::os::fd::OwnedFd;
use std::time::Duration;

use sandkasten_protocol::{Envelope, Message, encode};
use sandkasten_types::{Failure, FailureKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, watch};

use super::{AgentClient, Route, sandbox_gone};

/// How long the agent may take to answer the round trip before a pause.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the old socket may stay open once the new one is there (its sandbox is stopped: it ends at once).
const OLD_SOCKET_GRACE: Duration = Duration::from_secs(5);

/// Whether requests may be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    /// A pause is in progress: writes wait.
    Suspended,
    /// The sandbox is gone: writes fail.
    Closed,
}

/// What the reader is told.
pub(super) enum Switch {
    /// A pause begins: the current socket's end is not the agent's.
    Suspend,
    /// The pause failed before the sandbox stopped: the current socket serves on.
    Continue,
    /// The sandbox runs again behind this socket (after the current one has ended).
    Replace(OwnedReadHalf),
    /// The sandbox is gone.
    Close,
}

/// The writing side: the socket's write half, and whether it may be written.
pub(super) struct Writer {
    half: tokio::sync::Mutex<OwnedWriteHalf>,
    state: watch::Sender<State>,
}

/// The reading side, owned by the reader task.
pub(super) struct Reader {
    current: Option<OwnedReadHalf>,
    next: Option<OwnedReadHalf>,
    switches: mpsc::UnboundedReceiver<Switch>,
    suspended: bool,
}

/// Splits the agent's channel into the writer, the reader and the sender of the reader's switches.
pub(super) fn split(channel: OwnedFd) -> std::io::Result<(Writer, Reader, mpsc::UnboundedSender<Switch>)> {
    let (reader, writer) = tokio_stream(channel)?.into_split();
    let (switch_tx, switches) = mpsc::unbounded_channel();
    let writer = Writer { half: tokio::sync::Mutex::new(writer), state: watch::channel(State::Open).0 };
    Ok((writer, Reader { current: Some(reader), next: None, switches, suspended: false }, switch_tx))
}

fn tokio_stream(channel: OwnedFd) -> std::io::Result<UnixStream> {
    let std_stream = std::os::unix::net::UnixStream::from(channel);
    std_stream.set_nonblocking(true)?;
    UnixStream::from_std(std_stream)
}

impl Writer {
    /// Writes one frame; waits while a pause is in progress.
    pub(super) async fn write(&self, frame: &[u8]) -> Result<(), Failure> {
        let mut state = self.state.subscribe();
        loop {
            let now = *state.borrow_and_update();
            match now {
                State::Closed => return Err(sandbox_gone()),
                State::Suspended => state.changed().await.map_err(|_| sandbox_gone())?,
                State::Open => {
                    let mut half = self.half.lock().await;
                    // The state changes under this lock only: checked again now that it is held.
                    if *self.state.borrow() == State::Open {
                        return half.write_all(frame).await.map_err(|_| sandbox_gone());
                    }
                }
            }
        }
    }
}

impl Reader {
    /// Reads the next bytes of the agent's channel, across a replaced socket; 0 when the agent is gone.
    pub(super) async fn read(&mut self, buffer: &mut [u8]) -> usize {
        loop {
            let Some(current) = self.current.as_mut() else {
                let switch = self.switches.recv().await;
                if !self.apply(switch) {
                    return 0;
                }
                continue;
            };
            let grace = tokio::time::sleep(OLD_SOCKET_GRACE);
            let replacing = self.next.is_some();
            let ended = tokio::select! {
                biased;
                switch = self.switches.recv() => {
                    if !self.apply(switch) {
                        return 0;
                    }
                    continue;
                }
                read = current.read(buffer) => match read {
                    Ok(n) if n > 0 => return n,
                    _ => true,
                },
                () = grace, if replacing => {
                    tracing::warn!("the agent's old channel did not end after its sandbox was restored");
                    true
                }
            };
            if ended {
                // Switches sent before this end (a pause that began before the checkpoint) count.
                while let Ok(switch) = self.switches.try_recv() {
                    if !self.apply(Some(switch)) {
                        return 0;
                    }
                }
                self.current = self.next.take();
                if self.current.is_none() && !self.suspended {
                    return 0;
                }
            }
        }
    }

    /// Takes a switch into account; false when the agent is gone.
    fn apply(&mut self, switch: Option<Switch>) -> bool {
        match switch {
            Some(Switch::Suspend) => self.suspended = true,
            Some(Switch::Continue) => {
                self.suspended = false;
                // The old socket ended meanwhile: the sandbox died with the failed pause.
                if self.current.is_none() {
                    return false;
                }
            }
            Some(Switch::Replace(reader)) => {
                self.suspended = false;
                if self.current.is_none() {
                    self.current = Some(reader);
                } else {
                    self.next = Some(reader);
                }
            }
            Some(Switch::Close) | None => return false,
        }
        true
    }
}

impl AgentClient {
    /// Before a pause that ends the agent's channel (a gVisor checkpoint): `Quiesce`, after whose answer the agent has
    /// read every request sent before and holds no other host connection, and later requests wait until `reconnect`
    /// (or `unquiesce`).
    pub(crate) async fn quiesce(&self) -> Result<(), Failure> {
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, mut replies) = mpsc::unbounded_channel();
        self.pending.lock().map_err(|_| sandbox_gone())?.insert(id, Route::Free(tx));
        let frame = encode(&Envelope::new(id, Message::Quiesce))
            .map_err(|e| Failure::new(FailureKind::Internal, e.to_string()))?;
        let written = {
            let mut half = self.writer.half.lock().await;
            let open = *self.writer.state.borrow() == State::Open;
            if open {
                // Told before the checkpoint can end the socket.
                let _ = self.switches.send(Switch::Suspend);
                let written = half.write_all(&frame).await.map_err(|_| sandbox_gone());
                if written.is_ok() {
                    self.writer.state.send_replace(State::Suspended);
                }
                written
            } else {
                self.finish(id);
                return Err(Failure::new(FailureKind::Conflict, "the sandbox is being paused or resumed already"));
            }
        };
        let answered = match written {
            Ok(()) => tokio::time::timeout(QUIESCE_TIMEOUT, replies.recv()).await,
            Err(failure) => {
                self.finish(id);
                let _ = self.switches.send(Switch::Continue);
                return Err(failure);
            }
        };
        self.finish(id);
        match answered {
            Ok(Some(Message::Done)) => Ok(()),
            Ok(Some(other)) => {
                self.unquiesce().await;
                Err(super::unexpected(&other))
            }
            Ok(None) => Err(sandbox_gone()),
            Err(_) => {
                self.unquiesce().await;
                Err(Failure::new(
                    FailureKind::TierFailed,
                    format!("the sandbox's agent did not answer within {QUIESCE_TIMEOUT:?}; nothing was done"),
                ))
            }
        }
    }

    /// After a checkpoint that left the sandbox running (a memory snapshot, or a pause that failed before the sandbox
    /// stopped): requests go out on the old channel again, the first being `Resumed` (nothing was paused; the agent
    /// reports its commands and opens its connections to the host again).
    pub(crate) async fn unquiesce(&self) {
        let _ = self.switches.send(Switch::Continue);
        let mut half = self.writer.half.lock().await;
        let suspended = *self.writer.state.borrow() == State::Suspended;
        if suspended {
            if let Ok(frame) = encode(&Envelope::new(0, Message::Resumed { paused_ns: 0 })) {
                let _ = half.write_all(&frame).await;
            }
            self.writer.state.send_replace(State::Open);
        }
    }

    /// The sandbox runs again behind `channel` (a gVisor restore): `first` is its first frame (`Resumed`, id 0), then
    /// the requests that waited go out; replies continue on the same routes.
    pub(crate) async fn reconnect(&self, channel: OwnedFd, first: Message) -> Result<(), Failure> {
        let (reader, writer) = tokio_stream(channel)
            .map_err(|e| Failure::new(FailureKind::Internal, format!("the agent's new channel: {e}")))?
            .into_split();
        let frame = encode(&Envelope::new(0, first)).map_err(|e| Failure::new(FailureKind::Internal, e.to_string()))?;
        let _ = self.switches.send(Switch::Replace(reader));
        let mut half = self.writer.half.lock().await;
        // The old half goes now (its socket ended with the checkpoint).
        *half = writer;
        half.write_all(&frame).await.map_err(|_| sandbox_gone())?;
        if *self.writer.state.borrow() != State::Closed {
            self.writer.state.send_replace(State::Open);
        }
        Ok(())
    }

    /// The sandbox is gone (destroyed while paused, or it did not come back): waiting requests and routes end.
    pub(crate) fn close(&self) {
        self.writer.state.send_replace(State::Closed);
        let _ = self.switches.send(Switch::Close);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use sandkasten_protocol::FrameDecoder;

    use super::*;

    fn pair() -> (OwnedFd, std::os::unix::net::UnixStream) {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
        (OwnedFd::from(ours), theirs)
    }

    #[tokio::test]
    async fn a_frame_split_across_a_replaced_socket_arrives_whole_and_the_old_end_is_not_the_agents() {
        let (old, mut old_agent) = pair();
        let (_writer, mut reader, switches) = split(old).unwrap_or_else(|e| panic!("{e}"));
        let frame = encode(&Envelope::new(7, Message::Done)).unwrap_or_else(|e| panic!("{e}"));
        let (first, rest) = frame.split_at(frame.len() / 2);
        let _ = switches.send(Switch::Suspend);
        old_agent.write_all(first).unwrap_or_else(|e| panic!("{e}"));
        // The checkpoint ends the old socket: not the agent's end, a pause is in progress.
        drop(old_agent);
        let mut decoder = FrameDecoder::new();
        let mut buffer = vec![0u8; 1024];
        let n = reader.read(&mut buffer).await;
        assert_eq!(n, first.len());
        decoder.push(&buffer[..n]);
        assert!(matches!(decoder.next_envelope(), Ok(None)), "half a frame so far");
        let (new, mut new_agent) = pair();
        let (new_reader, _new_writer) = tokio_stream(new).unwrap_or_else(|e| panic!("{e}")).into_split();
        let _ = switches.send(Switch::Replace(new_reader));
        new_agent.write_all(rest).unwrap_or_else(|e| panic!("{e}"));
        let n = reader.read(&mut buffer).await;
        decoder.push(&buffer[..n]);
        let envelope = decoder.next_envelope().ok().flatten();
        assert_eq!(envelope.map(|e| (e.id, e.msg)), Some((7, Message::Done)), "the restored agent's rest of it");
        // Without a pause in progress, the end of the socket is the agent's end.
        drop(new_agent);
        assert_eq!(reader.read(&mut buffer).await, 0);
    }

    #[tokio::test]
    async fn writes_wait_while_suspended_and_fail_once_closed() {
        let (channel, _agent) = pair();
        let (writer, _reader, _switches) = split(channel).unwrap_or_else(|e| panic!("{e}"));
        writer.state.send_replace(State::Suspended);
        let waiting = tokio::time::timeout(Duration::from_millis(100), writer.write(b"x")).await;
        assert!(waiting.is_err(), "a write waits while a pause is in progress");
        writer.state.send_replace(State::Open);
        assert!(writer.write(b"x").await.is_ok());
        writer.state.send_replace(State::Closed);
        assert!(writer.write(b"x").await.is_err(), "a closed sandbox is gone");
    }
}
