//! Where a sandbox's connections to the proxy arrive: a TCP listener inside the sandbox's network namespace (the
//! process tier) or a unix socket that the sandbox's agent bridges to its loopback (tiers with a kernel of their own:
//! gVisor, microVMs). The proxy serves both the same way.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

pub use sandkasten_types::Entrance;

/// The entrance registered with tokio.
pub(crate) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    pub(crate) fn new(entrance: Entrance) -> io::Result<Listener> {
        match entrance {
            Entrance::Tcp(listener) => TcpListener::from_std(listener).map(Listener::Tcp),
            Entrance::Unix(listener) => UnixListener::from_std(listener).map(Listener::Unix),
        }
    }

    pub(crate) async fn accept(&self) -> io::Result<ClientStream> {
        match self {
            Listener::Tcp(listener) => {
                let (stream, _) = listener.accept().await?;
                let _ = stream.set_nodelay(true);
                Ok(ClientStream::Tcp(stream))
            }
            Listener::Unix(listener) => Ok(ClientStream::Unix(listener.accept().await?.0)),
        }
    }
}

/// One connection from a sandbox.
pub(crate) enum ClientStream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl AsyncRead for ClientStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Tcp(stream) => Pin::new(stream).poll_read(cx, buf),
            ClientStream::Unix(stream) => Pin::new(stream).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Tcp(stream) => Pin::new(stream).poll_write(cx, buf),
            ClientStream::Unix(stream) => Pin::new(stream).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Tcp(stream) => Pin::new(stream).poll_flush(cx),
            ClientStream::Unix(stream) => Pin::new(stream).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Tcp(stream) => Pin::new(stream).poll_shutdown(cx),
            ClientStream::Unix(stream) => Pin::new(stream).poll_shutdown(cx),
        }
    }
}
