//! The egress door of a guest agent: a listener on `127.0.0.1:port` inside the sandbox whose every connection is
//! forwarded, byte for byte, to the host's egress proxy: on gVisor as a connection to a unix socket bind-mounted
//! into the sandbox, in a microVM as a stream of the door mux over the `sandkasten.door` virtio-serial port (the
//! host connects each stream to the proxy). The proxy decides and audits; the door only carries bytes. It runs in a child process of the agent (the agent
//! itself stays single-threaded, because it forks commands), which dies with the agent.
//!
//! The agent keeps the listener and can stop the child and start a new one: before a gVisor checkpoint no connection
//! to a host socket may be open (runsc cannot save one), so `Quiesce` stops the door (its open connections end) and
//! `Resumed` starts it again; connections made meanwhile wait in the listener's backlog.

#![allow(unsafe_code)]

use std::cell::Cell;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sandkasten_protocol::{DoorExit, DoorPlan, MAX_DOOR_STREAMS, Mux};

use crate::serve::HostConnections;

/// Most connections the door carries at once (the proxy caps them too); more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 256;

/// The door: its listener (the agent's) and the child process serving it, while one does.
pub struct Door {
    listener: TcpListener,
    port: u16,
    exit: DoorExit,
    child: Cell<Option<libc::pid_t>>,
}

impl Door {
    /// Binds the door's port (so a failure is the agent's to report) and serves it from a child process.
    pub fn open(door: &DoorPlan) -> std::io::Result<Door> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, door.port))?;
        let door = Door { listener, port: door.port, exit: door.exit.clone(), child: Cell::new(None) };
        door.start()?;
        Ok(door)
    }

    /// Starts a child serving the listener, unless one does.
    fn start(&self) -> std::io::Result<()> {
        if self.child.get().is_some() {
            return Ok(());
        }
        let listener = self.listener.try_clone()?;
        // SAFETY: the agent is single-threaded, so the child may go on running Rust code (it starts threads of its
        // own and never forks).
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if pid > 0 {
            self.child.set(Some(pid));
            return Ok(());
        }
        // SAFETY: prctl with integer arguments: the door gets SIGKILL when the agent (its parent) exits.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) };
        match &self.exit {
            DoorExit::Socket(socket) => serve(listener, socket),
            DoorExit::VirtioPort(name) => serve_over_port(listener, self.port, name),
        }
        // SAFETY: _exit ends the forked child without running the agent's destructors.
        unsafe { libc::_exit(0) }
    }
}

impl HostConnections for Door {
    /// Kills the child (every connection it carries ends with it) and waits until it is gone; the listener stays, so
    /// new connections wait in its backlog.
    fn close_all(&self) {
        if let Some(pid) = self.child.take() {
            let mut status = 0;
            // SAFETY: kill and waitpid of our own child, not reaped yet (`reaped` forgets it when the serve loop
            // reaps it), so the pid cannot name another process.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                while libc::waitpid(pid, &mut status, libc::__WALL) < 0
                    && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
                {}
            }
        }
    }

    fn reopen(&self) {
        // A door that cannot start again leaves the sandbox without egress (connections wait, then time out);
        // nothing else depends on it.
        let _ = self.start();
    }

    /// If the door's child is among them, it is gone.
    fn reaped(&self, pids: &[libc::pid_t]) {
        if self.child.get().is_some_and(|pid| pids.contains(&pid)) {
            self.child.set(None);
        }
    }
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

/// Carries every connection as a stream of the door mux over the virtio-serial port `name`, at most
/// `MAX_DOOR_STREAMS` at once: at the cap the next connection waits in the listen backlog until a stream ends (the
/// host, where each stream holds a descriptor, refuses more). Ends when the port does (the host went away).
fn serve_over_port(listener: TcpListener, port: u16, name: &str) {
    let Ok(device) = crate::microvm::open_port(name) else { return };
    let Ok(writer) = device.try_clone() else { return };
    let mux: Mux<TcpStream> = Mux::new(Box::new(writer), MAX_DOOR_STREAMS);
    let reader = mux.clone();
    let demux = std::thread::Builder::new().name("door-port".into()).spawn(move || {
        reader.run(device, None);
        // SAFETY: _exit ends this door child once the host's side of the port is gone; no destructor needs to run.
        unsafe { libc::_exit(0) }
    });
    if demux.is_err() {
        return;
    }
    loop {
        while mux.is_full() {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let Ok((client, _)) = listener.accept() else { continue };
        // Refused (the host is at its cap, or the port is gone): the connection is dropped, its client sees it end.
        mux.open(client, port);
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
