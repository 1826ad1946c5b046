//! The egress door of a guest agent: a listener on `127.0.0.1:port` inside the sandbox whose every connection is
//! forwarded, byte for byte, to a unix socket that leads to the host's egress proxy (bind-mounted into the sandbox).
//! The proxy decides and audits; the door only carries bytes. It runs in a child process of the agent (the agent
//! itself stays single-threaded, because it forks commands), which dies with the agent.

#![allow(unsafe_code)]

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sandkasten_protocol::DoorPlan;

/// Most connections the door carries at once (the proxy caps them too); more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 256;

/// Binds the door's port (so a failure is the agent's to report) and serves it from a child process.
pub fn open(door: &DoorPlan) -> std::io::Result<()> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, door.port))?;
    // SAFETY: the agent is single-threaded here, so the child may go on running Rust code (it starts threads of its
    // own and never forks).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if pid > 0 {
        return Ok(());
    }
    // SAFETY: prctl with integer arguments: the door gets SIGKILL when the agent (its parent) exits.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) };
    serve(listener, &door.socket);
    // SAFETY: _exit ends the forked child without running the agent's destructors.
    unsafe { libc::_exit(0) }
}

fn serve(listener: TcpListener, socket: &str) {
    let open = Arc::new(AtomicUsize::new(0));
    for client in listener.incoming() {
        let Ok(client) = client else { continue };
        if open.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
            continue;
        }
        let Ok(upstream) = UnixStream::connect(socket) else { continue };
        open.fetch_add(1, Ordering::Relaxed);
        let counter = Arc::clone(&open);
        let spawned = std::thread::Builder::new().name("door".into()).spawn(move || {
            carry(client, upstream);
            counter.fetch_sub(1, Ordering::Relaxed);
        });
        if spawned.is_err() {
            open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Copies both ways until both directions have ended; each direction's end is passed on as a half-close.
fn carry(client: TcpStream, upstream: UnixStream) {
    let (Ok(mut client_read), Ok(mut upstream_write)) = (client.try_clone(), upstream.try_clone()) else { return };
    let outbound = std::thread::Builder::new().name("door-out".into()).spawn(move || {
        let _ = std::io::copy(&mut client_read, &mut upstream_write);
        let _ = upstream_write.shutdown(std::net::Shutdown::Write);
    });
    let (mut upstream_read, mut client_write) = (upstream, client);
    let _ = std::io::copy(&mut upstream_read, &mut client_write);
    let _ = client_write.shutdown(std::net::Shutdown::Write);
    if let Ok(outbound) = outbound {
        let _ = outbound.join();
    }
}
