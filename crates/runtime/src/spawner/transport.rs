//! One JSON message per `SOCK_SEQPACKET` packet, optionally carrying file descriptors (SCM_RIGHTS; at most
//! `MAX_FDS`: an agent's channel and a microVM's egress door).

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags, SocketFlags, SocketType, recvmsg, sendmsg, socketpair,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::RuntimeError;

/// Most descriptors one packet carries.
pub(crate) const MAX_FDS: usize = 2;

/// Largest message accepted, in bytes.
pub(crate) const MAX_PACKET: usize = 256 << 10;

/// A connected pair of packet sockets (close-on-exec).
pub(crate) fn packet_pair() -> Result<(OwnedFd, OwnedFd), RuntimeError> {
    socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
        .map_err(|e| RuntimeError::sys("socketpair(SOCK_SEQPACKET)", e))
}

/// Sends one message, with `fd` attached when given.
pub(crate) fn send<T: Serialize>(
    socket: BorrowedFd<'_>,
    message: &T,
    fd: Option<BorrowedFd<'_>>,
) -> Result<(), RuntimeError> {
    match fd {
        Some(fd) => send_with(socket, message, &[fd]),
        None => send_with(socket, message, &[]),
    }
}

/// Sends one message with `fds` attached (at most `MAX_FDS`).
pub(crate) fn send_with<T: Serialize>(
    socket: BorrowedFd<'_>,
    message: &T,
    fds: &[BorrowedFd<'_>],
) -> Result<(), RuntimeError> {
    let bytes = serde_json::to_vec(message)
        .map_err(|e| RuntimeError::sys("encoding a spawner message", std::io::Error::from(e)))?;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = &fds[..fds.len().min(MAX_FDS)];
    if !fds.is_empty() {
        control.push(SendAncillaryMessage::ScmRights(fds));
    }
    loop {
        match sendmsg(socket, &[IoSlice::new(&bytes)], &mut control, SendFlags::NOSIGNAL) {
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(RuntimeError::sys("sendmsg to the spawner socket", e)),
        }
    }
}

/// Receives one message and the descriptors attached to it, in order. `Ok(None)` when the peer closed the socket.
pub(crate) fn receive<T: DeserializeOwned>(socket: impl AsFd) -> Result<Option<(T, Vec<OwnedFd>)>, RuntimeError> {
    let mut buffer = vec![0u8; MAX_PACKET];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = loop {
        match recvmsg(&socket, &mut [IoSliceMut::new(&mut buffer)], &mut control, RecvFlags::CMSG_CLOEXEC) {
            Ok(received) => break received,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(RuntimeError::sys("recvmsg from the spawner socket", e)),
        }
    };
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    if received.bytes == 0 {
        return Ok(None);
    }
    let message = serde_json::from_slice(&buffer[..received.bytes])
        .map_err(|e| RuntimeError::sys("decoding a spawner message", std::io::Error::from(e)))?;
    Ok(Some((message, fds)))
}
