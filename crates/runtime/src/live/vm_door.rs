//! The host's side of a microVM's egress door: the acceptor of the door mux over the host end of the guest's
//! `sandkasten.door` port, connecting each stream the guest opens to the sandbox's door socket
//! (`microvm/ID/door.sock`), where the egress proxy listens while the policy lets anything out (`listen`). While it
//! does not (policy `none`), nothing listens there: every stream is refused at once and nothing leaves. The guest
//! holds at most `MAX_HOST_DOOR_STREAMS` streams on the host (two threads and one descriptor, its proxy connection,
//! each; the guest's agent opens at most `MAX_DOOR_STREAMS`) and at most
//! `PORT_WINDOW_BYTES` per stream of its bytes; the door ends with the sandbox (dropping `VmDoor`) or its VMM.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sandkasten_protocol::{Connect, MAX_HOST_DOOR_STREAMS, Mux};

use crate::backend::microvm::MicrovmFiles;
use crate::config::RuntimeConfig;

/// A microVM sandbox's running door.
pub(crate) struct VmDoor {
    channel: UnixStream,
    mux: Mux<UnixStream>,
}

/// Where the host's proxy listens for a microVM sandbox's door streams.
pub(crate) fn door_socket(config: &RuntimeConfig, id: &str) -> PathBuf {
    MicrovmFiles::new(config, id).dir.join("door.sock")
}

impl VmDoor {
    /// Serves the door channel `channel` of sandbox `id` on a thread of its own.
    pub(crate) fn start(config: &RuntimeConfig, id: &str, channel: OwnedFd) -> std::io::Result<VmDoor> {
        let channel = UnixStream::from(channel);
        let (reader, writer) = (channel.try_clone()?, channel.try_clone()?);
        let mux: Mux<UnixStream> = Mux::new(Box::new(writer), MAX_HOST_DOOR_STREAMS);
        let socket = door_socket(config, id);
        let connect: Connect<UnixStream> = Arc::new(move |_port| connect_to(&socket));
        let serving = mux.clone();
        std::thread::Builder::new().name(format!("vm-door-{id}")).spawn(move || serving.run(reader, Some(connect)))?;
        Ok(VmDoor { channel, mux })
    }
}

fn connect_to(socket: &Path) -> std::io::Result<UnixStream> {
    UnixStream::connect(socket)
}

impl Drop for VmDoor {
    /// Ends the door: its thread reads the end of the channel and closes every stream.
    fn drop(&mut self) {
        let _ = self.channel.shutdown(std::net::Shutdown::Both);
        self.mux.close_all();
    }
}
