//! A TCP listener that lives in a sandbox's network namespace but is held by the host: the egress proxy's door into a
//! sandbox that has no route out.
//!
//! A short-lived thread joins the sandbox's network namespace (`setns` on the agent's pidfd: no pid-reuse race),
//! binds the socket and leaves; a socket stays in the namespace it was created in, so the host process accepts
//! connections that code inside the sandbox makes to `127.0.0.1:PORT` on its own loopback. Nothing is added to the
//! namespace (no interface, no route); the listener keeps the namespace alive only while the host holds it.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::BorrowedFd;

use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};

/// Binds `127.0.0.1:port` inside the network namespace of the process behind `pidfd`; the listener is non-blocking
/// (ready for `tokio::net::TcpListener::from_std`).
pub fn listen_in_netns(pidfd: BorrowedFd<'_>, port: u16) -> std::io::Result<TcpListener> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // Only this thread changes namespace; it ends right after, so no other work ever runs inside.
                move_into_link_name_space(pidfd, Some(LinkNameSpaceType::Network))?;
                let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))?;
                listener.set_nonblocking(true)?;
                Ok(listener)
            })
            .join()
            .map_err(|_| std::io::Error::other("the namespace thread panicked"))?
    })
}
