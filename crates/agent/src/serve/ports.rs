//! Port streams (`PortOpen` … `PortEof`/`PortClose`): TCP connections the agent opens to `127.0.0.1:port` inside
//! the sandbox — in its own network namespace (process tier) or network stack (gVisor) — for the host's requests to
//! a sandbox's port, so no host port is opened and nothing of the host's network is reachable through them. The
//! connection's bytes travel over the channel as `PortData` frames, polled with everything else in the serve loop.
//!
//! Bounds: at most `MAX_PORT_STREAMS` streams at once; per stream and direction at most `PORT_WINDOW_BYTES` sent and
//! not yet acknowledged (`PortAck`), so the agent never holds more than a window of what the host sent for a
//! connection, and reads a connection only while the host has room for more and the channel is not congested.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rustix::event::PollFlags;
use rustix::io::Errno;
use rustix::net::{AddressFamily, Shutdown, SocketFlags, SocketType};
use sandkasten_protocol::{MAX_PORT_CHUNK_BYTES, MAX_PORT_STREAMS, Message, PORT_WINDOW_BYTES};
use sandkasten_types::{Failure, FailureKind};

use super::channel::Channel;

/// One connection to a port inside the sandbox.
#[derive(Debug)]
struct PortStream {
    socket: OwnedFd,
    port: u16,
    /// The non-blocking connect has not completed yet (the `PortOpen` is not answered).
    connecting: bool,
    /// Bytes from the host not yet written to the connection (at most a window).
    to_socket: Vec<u8>,
    /// Bytes sent to the host and not yet acknowledged.
    unacked: u64,
    /// The host sent `PortEof`: shut the connection's write side once `to_socket` is written.
    host_done: bool,
    /// The connection reached end-of-file and `PortEof` was sent.
    socket_done: bool,
}

/// The sandbox's port streams, by id.
#[derive(Debug, Default)]
pub struct PortStreams {
    table: BTreeMap<u64, PortStream>,
}

impl PortStreams {
    /// Handles a port message from the host (`PortOpen`, `PortData`, `PortAck`, `PortEof`, `PortClose`), queueing
    /// whatever it answers. Messages about an unknown id (a stream that ended meanwhile) are ignored.
    pub fn handle(&mut self, channel: &mut Channel, id: u64, msg: Message) {
        match msg {
            Message::PortOpen { port } => match self.open(id, port) {
                Ok(true) => channel.queue(id, Message::Done),
                Ok(false) => {}
                Err(failure) => channel.queue(id, Message::Failed(failure)),
            },
            Message::PortData { data } => {
                let Some(stream) = self.table.get_mut(&id) else { return };
                let bytes = match STANDARD.decode(data) {
                    Ok(bytes) => bytes,
                    Err(e) => {
                        return self.fail(channel, id, FailureKind::Internal, format!("port data is not base64: {e}"));
                    }
                };
                if stream.host_done || stream.to_socket.len() as u64 + bytes.len() as u64 > PORT_WINDOW_BYTES {
                    let why = "the host sent more than its window of port data";
                    return self.fail(channel, id, FailureKind::Internal, why.to_owned());
                }
                stream.to_socket.extend_from_slice(&bytes);
            }
            Message::PortAck { bytes } => {
                if let Some(stream) = self.table.get_mut(&id) {
                    stream.unacked = stream.unacked.saturating_sub(bytes);
                }
            }
            Message::PortEof => {
                if let Some(stream) = self.table.get_mut(&id) {
                    stream.host_done = true;
                }
                self.finish_writes(channel, id);
            }
            Message::PortClose => {
                self.table.remove(&id);
            }
            _ => {}
        }
    }

    /// Starts connecting stream `id` to `127.0.0.1:port`; `Ok(true)` once connected already, `Ok(false)` while the
    /// connect is in progress (answered from `ready` when it completes).
    fn open(&mut self, id: u64, port: u16) -> Result<bool, Failure> {
        if port == 0 {
            return Err(Failure::new(FailureKind::InvalidPath, "port 0 is not a port one can connect to"));
        }
        if self.table.contains_key(&id) {
            return Err(Failure::new(FailureKind::Conflict, format!("port stream {id} exists already")));
        }
        if self.table.len() >= MAX_PORT_STREAMS {
            return Err(Failure::new(
                FailureKind::Conflict,
                format!("this sandbox has {MAX_PORT_STREAMS} port connections open already; try again when one ends"),
            ));
        }
        let flags = SocketFlags::NONBLOCK | SocketFlags::CLOEXEC;
        let socket = rustix::net::socket_with(AddressFamily::INET, SocketType::STREAM, flags, None)
            .map_err(|e| Failure::new(FailureKind::Internal, format!("socket for port {port}: {e}")))?;
        let connected = match rustix::net::connect(&socket, &SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)) {
            Ok(()) => true,
            Err(Errno::INPROGRESS | Errno::INTR) => false,
            Err(errno) => return Err(connect_failure(port, errno)),
        };
        let stream = PortStream {
            socket,
            port,
            connecting: !connected,
            to_socket: Vec::new(),
            unacked: 0,
            host_done: false,
            socket_done: false,
        };
        self.table.insert(id, stream);
        Ok(connected)
    }

    /// The descriptors to poll with what each waits for: connecting (writable), data for the host (readable, while
    /// its window has room and `reading`), data for the connection (writable).
    pub fn interests(&self, reading: bool) -> impl Iterator<Item = (u64, BorrowedFd<'_>, PollFlags)> {
        self.table.iter().filter_map(move |(&id, stream)| {
            let mut flags = PollFlags::empty();
            if stream.connecting || !stream.to_socket.is_empty() {
                flags |= PollFlags::OUT;
            }
            if reading && !stream.connecting && !stream.socket_done && stream.unacked < PORT_WINDOW_BYTES {
                flags |= PollFlags::IN;
            }
            (!flags.is_empty()).then(|| (id, stream.socket.as_fd(), flags))
        })
    }

    /// Stream `id`'s connection is ready as `revents` says: complete its connect, read what it has for the host,
    /// write what the host sent.
    pub fn ready(&mut self, channel: &mut Channel, id: u64, revents: PollFlags) {
        let Some(stream) = self.table.get_mut(&id) else { return };
        if stream.connecting {
            let port = stream.port;
            match rustix::net::sockopt::socket_error(&stream.socket) {
                Ok(Ok(())) => {
                    stream.connecting = false;
                    channel.queue(id, Message::Done);
                }
                Ok(Err(errno)) | Err(errno) => {
                    self.table.remove(&id);
                    channel.queue(id, Message::Failed(connect_failure(port, errno)));
                }
            }
            return;
        }
        if revents.intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR) && !stream.socket_done {
            self.read(channel, id);
        }
        if revents.intersects(PollFlags::OUT | PollFlags::ERR) {
            self.finish_writes(channel, id);
        }
    }

    /// Reads what the connection has, as far as the host's window allows, into `PortData` frames.
    fn read(&mut self, channel: &mut Channel, id: u64) {
        let Some(stream) = self.table.get_mut(&id) else { return };
        let room = PORT_WINDOW_BYTES.saturating_sub(stream.unacked) as usize;
        let mut buffer = vec![0u8; MAX_PORT_CHUNK_BYTES.min(room)];
        if buffer.is_empty() {
            return;
        }
        match rustix::io::read(&stream.socket, &mut buffer) {
            Ok(0) => {
                stream.socket_done = true;
                channel.queue(id, Message::PortEof);
                self.forget_if_done(id);
            }
            Ok(n) => {
                stream.unacked += n as u64;
                channel.queue(id, Message::PortData { data: STANDARD.encode(&buffer[..n]) });
            }
            Err(Errno::AGAIN | Errno::INTR) => {}
            Err(errno) => {
                let message = format!("the connection to port {} broke: {errno}", stream.port);
                self.fail(channel, id, FailureKind::Conflict, message);
            }
        }
    }

    /// Writes what the host sent to the connection (acknowledging what was written), and shuts its write side once
    /// the host has ended and everything is written.
    fn finish_writes(&mut self, channel: &mut Channel, id: u64) {
        let Some(stream) = self.table.get_mut(&id) else { return };
        if stream.connecting {
            return;
        }
        let mut written = 0usize;
        while written < stream.to_socket.len() {
            match rustix::io::write(&stream.socket, &stream.to_socket[written..]) {
                Ok(n) => written += n,
                Err(Errno::INTR) => {}
                Err(Errno::AGAIN) => break,
                Err(errno) => {
                    let message = format!("the connection to port {} broke: {errno}", stream.port);
                    return self.fail(channel, id, FailureKind::Conflict, message);
                }
            }
        }
        if written > 0 {
            stream.to_socket.drain(..written);
            channel.queue(id, Message::PortAck { bytes: written as u64 });
        }
        if stream.host_done && stream.to_socket.is_empty() {
            // Shutting down twice (or a peer gone already) is harmless.
            let _ = rustix::net::shutdown(&stream.socket, Shutdown::Write);
            self.forget_if_done(id);
        }
    }

    /// Both directions ended and everything is written: the stream is over.
    fn forget_if_done(&mut self, id: u64) {
        if self.table.get(&id).is_some_and(|s| s.socket_done && s.host_done && s.to_socket.is_empty()) {
            self.table.remove(&id);
        }
    }

    /// Ends stream `id` with a `Failed` (the last message about it).
    fn fail(&mut self, channel: &mut Channel, id: u64, kind: FailureKind, message: String) {
        self.table.remove(&id);
        channel.queue(id, Message::Failed(Failure::new(kind, message)));
    }
}

/// A connect that did not succeed, as the host answers it.
fn connect_failure(port: u16, errno: Errno) -> Failure {
    match errno {
        Errno::CONNREFUSED => Failure::new(
            FailureKind::NothingListening,
            format!(
                "nothing listens on port {port} in the sandbox (start a server on 0.0.0.0:{port} or 127.0.0.1:{port} first)"
            ),
        ),
        errno => {
            Failure::new(FailureKind::Conflict, format!("connecting to port {port} in the sandbox failed: {errno}"))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::os::unix::net::UnixStream;

    use rustix::event::{PollFd, Timespec, poll};

    use super::*;

    /// Polls stream `id` as the serve loop would, once, up to a second, and hands it what is ready.
    fn step(streams: &mut PortStreams, channel: &mut Channel, id: u64) {
        let ready = {
            let Some((_, fd, interest)) = streams.interests(true).find(|(other, _, _)| *other == id) else { return };
            let mut fds = [PollFd::from_borrowed_fd(fd, interest)];
            poll(&mut fds, Some(&Timespec { tv_sec: 1, tv_nsec: 0 })).unwrap();
            fds[0].revents()
        };
        streams.ready(channel, id, ready);
    }

    /// Opens stream `id` and drives its connect to the end.
    fn open(streams: &mut PortStreams, channel: &mut Channel, id: u64, port: u16) {
        streams.handle(channel, id, Message::PortOpen { port });
        for _ in 0..10 {
            if !streams.table.get(&id).is_some_and(|stream| stream.connecting) {
                return;
            }
            step(streams, channel, id);
        }
    }

    /// Everything the agent queued, once its channel is flushed and closed.
    fn sent(mut channel: Channel, host: UnixStream) -> Vec<(u64, Message)> {
        channel.flush();
        drop(channel);
        let mut reader = host;
        let mut messages = Vec::new();
        while let Ok(Some(envelope)) = sandkasten_protocol::read_frame(&mut reader) {
            messages.push((envelope.id, envelope.msg));
        }
        messages
    }

    #[test]
    fn a_refused_connection_names_the_port_and_the_streams_are_bounded() {
        // A port nothing listens on: bind one, note it, close it.
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let (agent, host) = UnixStream::pair().unwrap();
        let mut channel = Channel::new(agent).unwrap();
        let mut streams = PortStreams::default();
        open(&mut streams, &mut channel, 1, port);
        streams.handle(&mut channel, 2, Message::PortOpen { port: 0 });
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let open_port = listener.local_addr().unwrap().port();
        for id in 0..MAX_PORT_STREAMS as u64 {
            streams.handle(&mut channel, 100 + id, Message::PortOpen { port: open_port });
        }
        streams.handle(&mut channel, 999, Message::PortOpen { port: open_port });
        let failures: Vec<(u64, Failure)> = sent(channel, host)
            .into_iter()
            .filter_map(|(id, msg)| match msg {
                Message::Failed(failure) => Some((id, failure)),
                _ => None,
            })
            .collect();
        assert_eq!(failures.len(), 3, "{failures:?}");
        assert_eq!((failures[0].0, failures[0].1.kind), (1, FailureKind::NothingListening), "{failures:?}");
        assert!(failures[0].1.message.contains(&format!("nothing listens on port {port}")), "{failures:?}");
        assert_eq!((failures[1].0, failures[1].1.kind), (2, FailureKind::InvalidPath));
        assert_eq!(failures[2].0, 999);
        assert!(failures[2].1.message.contains("port connections open already"), "{failures:?}");
    }

    #[test]
    fn bytes_travel_both_ways_within_the_window() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (agent, host) = UnixStream::pair().unwrap();
        let mut channel = Channel::new(agent).unwrap();
        let mut streams = PortStreams::default();
        open(&mut streams, &mut channel, 7, port);
        let (mut server, _) = listener.accept().unwrap();
        streams.handle(&mut channel, 7, Message::PortData { data: STANDARD.encode(b"ping") });
        step(&mut streams, &mut channel, 7);
        let mut got = [0u8; 4];
        server.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
        server.write_all(b"pong").unwrap();
        drop(server);
        for _ in 0..4 {
            step(&mut streams, &mut channel, 7);
        }
        // The host's end: the rest is written and the write side shut, then the stream is over.
        streams.handle(&mut channel, 7, Message::PortEof);
        assert!(!streams.table.contains_key(&7), "both directions ended");
        let messages: Vec<Message> = sent(channel, host).into_iter().map(|(_, msg)| msg).collect();
        assert_eq!(
            messages,
            [
                Message::Done,
                Message::PortAck { bytes: 4 },
                Message::PortData { data: STANDARD.encode(b"pong") },
                Message::PortEof
            ]
        );
    }

    #[test]
    fn a_host_sending_past_its_window_loses_the_stream() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (agent, _host) = UnixStream::pair().unwrap();
        let mut channel = Channel::new(agent).unwrap();
        let mut streams = PortStreams::default();
        open(&mut streams, &mut channel, 3, listener.local_addr().unwrap().port());
        assert!(streams.table.contains_key(&3));
        let too_much = STANDARD.encode(vec![0u8; PORT_WINDOW_BYTES as usize + 1]);
        streams.handle(&mut channel, 3, Message::PortData { data: too_much });
        assert!(!streams.table.contains_key(&3), "the stream is gone");
    }
}
