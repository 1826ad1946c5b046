//! The stream multiplexer both ends of a microVM's egress door run (the guest's agent and the host): many TCP-like
//! connections carried as numbered streams over one byte channel (a virtio-serial port), in the agent protocol's
//! frames and its port-stream messages.
//!
//! The opener (the guest) sends `PortOpen { port }` with a stream id of its choosing; the acceptor (the host)
//! connects the stream to its side and answers `Done`, or `Failed` when it cannot (nothing to connect to, or
//! `max_streams` streams of this channel are alive). Then `PortData`, `PortAck`, `PortEof` travel both ways with the
//! port streams' window (`PORT_WINDOW_BYTES` sent and not yet acknowledged, per stream and direction), and
//! `PortClose` from either side ends a stream at once. A peer that breaks the rules (more than the window, bad
//! base64, an id in use) gets the stream closed, never a bigger buffer: one side holds at most
//! `max_streams × PORT_WINDOW_BYTES` for its peer, and at most two threads per live stream.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use sandkasten_types::{Failure, FailureKind};

use crate::codec::{read_frame, write_frame};
use crate::message::{Envelope, Message};
use crate::serve_types::{MAX_PORT_CHUNK_BYTES, PORT_WINDOW_BYTES};

/// A connection a stream carries: read and written through shared references from two threads at once, and shut
/// down from a third. One descriptor per stream: the pumps share it rather than each holding a duplicate.
pub trait MuxStream: Send + Sync + Sized + 'static {
    /// Reads what is there (as `Read::read`).
    fn read_some(&self, buffer: &mut [u8]) -> io::Result<usize>;
    /// Writes all of `bytes` (as `Write::write_all`).
    fn write_every(&self, bytes: &[u8]) -> io::Result<()>;
    /// Shuts down one or both directions (ends a blocked read or write of another thread).
    fn shut(&self, how: Shutdown);
}

impl MuxStream for TcpStream {
    fn read_some(&self, buffer: &mut [u8]) -> io::Result<usize> {
        (&mut &*self).read(buffer)
    }
    fn write_every(&self, bytes: &[u8]) -> io::Result<()> {
        (&mut &*self).write_all(bytes)
    }
    fn shut(&self, how: Shutdown) {
        let _ = self.shutdown(how);
    }
}

impl MuxStream for UnixStream {
    fn read_some(&self, buffer: &mut [u8]) -> io::Result<usize> {
        (&mut &*self).read(buffer)
    }
    fn write_every(&self, bytes: &[u8]) -> io::Result<()> {
        (&mut &*self).write_all(bytes)
    }
    fn shut(&self, how: Shutdown) {
        let _ = self.shutdown(how);
    }
}

/// Most streams a microVM's egress door carries at once from the guest: its agent opens no more, and further
/// connections wait in its listen backlog (as they wait in the sandbox's backlog for the proxy on the other tiers).
pub const MAX_DOOR_STREAMS: usize = 16;

/// Most streams the host's end of a microVM's door takes at once (each holds a host descriptor): the guest's cap, and
/// a margin for streams the guest has let go that the host has not wound down yet.
pub const MAX_HOST_DOOR_STREAMS: usize = MAX_DOOR_STREAMS + 8;

/// How the acceptor connects a newly opened stream (`PortOpen`'s port → a connection), on the stream's own thread.
pub type Connect<S> = Arc<dyn Fn(u16) -> io::Result<S> + Send + Sync>;

/// One end of a door channel. Cheap to clone: every clone is the same mux.
pub struct Mux<S: MuxStream> {
    shared: Arc<Shared<S>>,
}

impl<S: MuxStream> Clone for Mux<S> {
    fn clone(&self) -> Self {
        Mux { shared: Arc::clone(&self.shared) }
    }
}

struct Shared<S> {
    out: Mutex<Box<dyn Write + Send>>,
    streams: Mutex<HashMap<u64, Arc<Stream<S>>>>,
    /// Streams whose threads or buffers still exist (also those closed and not yet wound down).
    alive: Arc<AtomicUsize>,
    max_streams: usize,
    next_id: AtomicU64,
}

struct Stream<S> {
    conn: Mutex<Option<Arc<S>>>,
    state: Mutex<State>,
    changed: Condvar,
    _slot: Slot,
}

#[derive(Default)]
struct State {
    /// Bytes this side may still send to the peer.
    credit: u64,
    /// Bytes from the peer not yet written to the connection.
    inbound: Vec<u8>,
    /// Bytes from the peer not yet acknowledged: those in `inbound` and those the inward pump is writing to the
    /// connection (a slow reader holds them there). The window bounds this, not `inbound` alone: a peer sending
    /// past its credit while a write blocks is caught.
    unacked: u64,
    peer_eof: bool,
    closed: bool,
    /// Pumps that have ended (the stream is over when both have).
    pumps_ended: u8,
}

/// One of `alive`'s counts, given back when the stream's last handle goes.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<S: MuxStream> Mux<S> {
    /// A mux writing its frames to `out`, carrying at most `max_streams` streams at once.
    pub fn new(out: Box<dyn Write + Send>, max_streams: usize) -> Mux<S> {
        Mux {
            shared: Arc::new(Shared {
                out: Mutex::new(out),
                streams: Mutex::new(HashMap::new()),
                alive: Arc::new(AtomicUsize::new(0)),
                max_streams,
                next_id: AtomicU64::new(1),
            }),
        }
    }

    /// How many streams exist (open, or closed with threads still winding down).
    pub fn alive(&self) -> usize {
        self.shared.alive.load(Ordering::Acquire)
    }

    /// Whether `max_streams` streams are alive: an opener waits before it takes another connection.
    pub fn is_full(&self) -> bool {
        self.shared.alive.load(Ordering::Acquire) >= self.shared.max_streams
    }

    /// Opener: carries `conn` as a new stream to `port` on the acceptor's side. False (and `conn` dropped) when
    /// `max_streams` are alive or the channel is gone.
    pub fn open(&self, conn: S, port: u16) -> bool {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let Some(stream) = self.register(id) else { return false };
        if !self.send(id, Message::PortOpen { port }) {
            self.close(id, &stream, false);
            return false;
        }
        self.start(id, stream, conn)
    }

    /// Reads the peer's frames from `input` until it ends, then closes every stream. An acceptor passes `connect`;
    /// an opener (which accepts no `PortOpen`) passes `None`.
    pub fn run(&self, input: impl Read, connect: Option<Connect<S>>) {
        let mut input = io::BufReader::with_capacity(MAX_PORT_CHUNK_BYTES * 2, input);
        while let Ok(Some(envelope)) = read_frame(&mut input) {
            self.handle(envelope.id, envelope.msg, connect.as_ref());
        }
        self.close_all();
    }

    /// Closes every stream (their connections are shut down both ways), telling the peer while it listens.
    pub fn close_all(&self) {
        let streams: Vec<_> = lock(&self.shared.streams).drain().collect();
        for (id, stream) in streams {
            self.close(id, &stream, true);
        }
    }

    fn handle(&self, id: u64, msg: Message, connect: Option<&Connect<S>>) {
        let stream = lock(&self.shared.streams).get(&id).cloned();
        match (msg, stream) {
            (Message::PortOpen { port }, None) => match connect {
                Some(connect) => self.accept(id, port, Arc::clone(connect)),
                None => {
                    self.send(id, Message::PortClose);
                }
            },
            // An id in use opened again: the peer is confused; the stream ends.
            (Message::PortOpen { .. }, Some(stream)) => self.close(id, &stream, true),
            (Message::PortData { data }, Some(stream)) => match STANDARD.decode(data.as_bytes()) {
                Ok(bytes) => {
                    let mut state = lock(&stream.state);
                    if state.unacked + bytes.len() as u64 > PORT_WINDOW_BYTES {
                        drop(state);
                        self.close(id, &stream, true);
                    } else {
                        state.unacked += bytes.len() as u64;
                        state.inbound.extend_from_slice(&bytes);
                        stream.changed.notify_all();
                    }
                }
                Err(_) => self.close(id, &stream, true),
            },
            (Message::PortAck { bytes }, Some(stream)) => {
                let mut state = lock(&stream.state);
                state.credit = state.credit.saturating_add(bytes).min(PORT_WINDOW_BYTES);
                stream.changed.notify_all();
            }
            (Message::PortEof, Some(stream)) => {
                lock(&stream.state).peer_eof = true;
                stream.changed.notify_all();
            }
            (Message::PortClose | Message::Failed(_), Some(stream)) => self.close(id, &stream, false),
            // `Done` (the acceptor connected: data already flows), and anything about a stream that is gone.
            _ => {}
        }
    }

    /// Acceptor: a new stream `id` to `port`, connected on a thread of its own; the peer's data waits (within the
    /// window) until it is.
    fn accept(&self, id: u64, port: u16, connect: Connect<S>) {
        let Some(stream) = self.register(id) else {
            let failure = Failure::new(FailureKind::Conflict, "too many door streams are open: close some");
            self.send(id, Message::Failed(failure));
            return;
        };
        let mux = self.clone();
        let spawned = std::thread::Builder::new().name("door-connect".into()).spawn(move || match connect(port) {
            Ok(conn) => {
                if mux.send(id, Message::Done) {
                    mux.start(id, stream, conn);
                } else {
                    mux.close(id, &stream, false);
                }
            }
            Err(error) => {
                mux.forget(id, &stream);
                let failure = Failure::new(FailureKind::NothingListening, format!("the door leads nowhere: {error}"));
                mux.send(id, Message::Failed(failure));
            }
        });
        if spawned.is_err() {
            self.forget_id(id);
            self.send(id, Message::Failed(Failure::new(FailureKind::Conflict, "no thread for the door stream")));
        }
    }

    /// A new stream `id` in the table, unless `max_streams` are alive.
    fn register(&self, id: u64) -> Option<Arc<Stream<S>>> {
        let shared = &self.shared;
        let mut streams = lock(&shared.streams);
        if shared.alive.fetch_add(1, Ordering::AcqRel) >= shared.max_streams {
            shared.alive.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let stream = Arc::new(Stream {
            conn: Mutex::new(None),
            state: Mutex::new(State { credit: PORT_WINDOW_BYTES, ..State::default() }),
            changed: Condvar::new(),
            _slot: Slot(Arc::clone(&shared.alive)),
        });
        streams.insert(id, Arc::clone(&stream));
        Some(stream)
    }

    /// Starts the stream's two pumps over `conn`. False when it could not (the stream is closed).
    fn start(&self, id: u64, stream: Arc<Stream<S>>, conn: S) -> bool {
        let conn = Arc::new(conn);
        let (reader, writer) = (Arc::clone(&conn), Arc::clone(&conn));
        *lock(&stream.conn) = Some(conn);
        if lock(&stream.state).closed {
            // Closed while it connected.
            self.close(id, &stream, false);
            return false;
        }
        let (mux, out_stream) = (self.clone(), Arc::clone(&stream));
        let outward = std::thread::Builder::new().name("door-out".into()).spawn(move || {
            mux.pump_out(id, &out_stream, reader);
            mux.pump_ended(id, &out_stream);
        });
        let (mux, in_stream) = (self.clone(), Arc::clone(&stream));
        let inward = std::thread::Builder::new().name("door-in".into()).spawn(move || {
            mux.pump_in(id, &in_stream, writer);
            mux.pump_ended(id, &in_stream);
        });
        if outward.is_err() || inward.is_err() {
            self.close(id, &stream, true);
            return false;
        }
        true
    }

    /// The connection's bytes to the peer, as the window allows; its end is the peer's `PortEof`.
    fn pump_out(&self, id: u64, stream: &Stream<S>, conn: Arc<S>) {
        let mut buffer = vec![0u8; MAX_PORT_CHUNK_BYTES];
        loop {
            let allowed = {
                let mut state = lock(&stream.state);
                while state.credit == 0 && !state.closed {
                    state = stream.changed.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                if state.closed {
                    return;
                }
                (state.credit as usize).min(buffer.len())
            };
            match conn.read_some(&mut buffer[..allowed]) {
                Ok(0) => {
                    self.send(id, Message::PortEof);
                    return;
                }
                Ok(n) => {
                    lock(&stream.state).credit -= n as u64;
                    if !self.send(id, Message::PortData { data: STANDARD.encode(&buffer[..n]) }) {
                        return;
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.close_id(id, stream);
                    return;
                }
            }
        }
    }

    /// The peer's bytes into the connection, each write acknowledged; the peer's end becomes a half-close.
    fn pump_in(&self, id: u64, stream: &Stream<S>, conn: Arc<S>) {
        loop {
            let (bytes, eof) = {
                let mut state = lock(&stream.state);
                while state.inbound.is_empty() && !state.peer_eof && !state.closed {
                    state = stream.changed.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                if state.closed {
                    return;
                }
                (std::mem::take(&mut state.inbound), state.peer_eof)
            };
            if !bytes.is_empty() {
                if conn.write_every(&bytes).is_err() {
                    self.close_id(id, stream);
                    return;
                }
                // Before the acknowledgement goes out: the peer may send again as soon as it has it.
                let mut state = lock(&stream.state);
                state.unacked = state.unacked.saturating_sub(bytes.len() as u64);
                drop(state);
                if !self.send(id, Message::PortAck { bytes: bytes.len() as u64 }) {
                    return;
                }
            }
            if eof && lock(&stream.state).inbound.is_empty() {
                conn.shut(Shutdown::Write);
                return;
            }
        }
    }

    /// One pump of the stream ended; after the second the stream is over and leaves the table.
    fn pump_ended(&self, id: u64, stream: &Arc<Stream<S>>) {
        let over = {
            let mut state = lock(&stream.state);
            state.pumps_ended += 1;
            state.pumps_ended == 2
        };
        if over {
            self.forget(id, stream);
            lock(&stream.conn).take();
        }
    }

    /// Closes the stream with this id if `stream` is still the one under it, telling the peer.
    fn close_id(&self, id: u64, stream: &Stream<S>) {
        let current = lock(&self.shared.streams).get(&id).cloned();
        if let Some(current) = current
            && std::ptr::eq(Arc::as_ptr(&current), stream)
        {
            self.close(id, &current, true);
        }
    }

    /// Ends a stream: out of the table, its connection shut both ways, its pumps woken to end; `tell` the peer.
    fn close(&self, id: u64, stream: &Arc<Stream<S>>, tell: bool) {
        self.forget(id, stream);
        {
            let mut state = lock(&stream.state);
            state.closed = true;
            state.inbound = Vec::new();
            state.unacked = 0;
        }
        stream.changed.notify_all();
        if let Some(conn) = lock(&stream.conn).take() {
            conn.shut(Shutdown::Both);
        }
        if tell {
            self.send(id, Message::PortClose);
        }
    }

    /// Takes `stream` out of the table (if it is still the one under `id`).
    fn forget(&self, id: u64, stream: &Arc<Stream<S>>) {
        let mut streams = lock(&self.shared.streams);
        if streams.get(&id).is_some_and(|current| Arc::ptr_eq(current, stream)) {
            streams.remove(&id);
        }
    }

    fn forget_id(&self, id: u64) {
        lock(&self.shared.streams).remove(&id);
    }

    /// Writes one frame to the channel; false when it is gone.
    fn send(&self, id: u64, msg: Message) -> bool {
        let mut out = lock(&self.shared.out);
        write_frame(&mut *out, &Envelope::new(id, msg)).is_ok() && out.flush().is_ok()
    }
}

#[cfg(test)]
#[path = "mux_tests.rs"]
mod tests;
