//! The benchmark's client: one GET over a new connection, by one of three routes (straight to the upstream,
//! plain-HTTP forwarding through the proxy, or a CONNECT tunnel through the proxy with the GET inside). It
//! writes raw HTTP/1.1 and reads the response until its `Content-Length` is complete, so the same code and the
//! same buffer size serve every route and only the path between client and upstream differs.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Result type of the benchmark.
pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// How a request reaches the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Straight to the upstream.
    Direct,
    /// `GET http://name:port/path` to the proxy (plain-HTTP forwarding).
    Forward,
    /// `CONNECT name:port` to the proxy, then the GET inside the tunnel.
    Tunnel,
}

impl Route {
    /// Every route, in a fixed order.
    pub const ALL: [Route; 3] = [Route::Direct, Route::Forward, Route::Tunnel];

    /// The route's key in the JSON.
    pub fn key(self) -> &'static str {
        match self {
            Route::Direct => "direct",
            Route::Forward => "forward",
            Route::Tunnel => "connect",
        }
    }
}

/// Where the upstream and the proxy listen, and the name the proxy resolves to the upstream.
pub struct Client {
    /// The upstream's address.
    pub upstream: SocketAddr,
    /// The proxy's listener.
    pub proxy: SocketAddr,
    /// `name:port` of the upstream as the proxy knows it.
    pub authority: String,
    buf: Vec<u8>,
}

impl Client {
    /// A client reading with a `read_buf`-byte buffer.
    pub fn new(upstream: SocketAddr, proxy: SocketAddr, name: &str, read_buf: usize) -> Client {
        let authority = format!("{name}:{}", upstream.port());
        Client { upstream, proxy, authority, buf: vec![0u8; read_buf] }
    }

    /// GETs `path` over a new connection by `route`; returns the body length. Fails on anything but a
    /// complete 200 response.
    pub async fn get(&mut self, route: Route, path: &str) -> Result<u64> {
        let authority = &self.authority;
        let origin_form = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
        let mut stream = match route {
            Route::Direct => connect(self.upstream).await?,
            Route::Forward | Route::Tunnel => connect(self.proxy).await?,
        };
        match route {
            Route::Direct => stream.write_all(origin_form.as_bytes()).await?,
            Route::Forward => {
                let req =
                    format!("GET http://{authority}{path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
                stream.write_all(req.as_bytes()).await?;
            }
            Route::Tunnel => {
                let req = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n");
                stream.write_all(req.as_bytes()).await?;
                let len = read_response(&mut stream, &mut self.buf).await?;
                if len != 0 {
                    return Err(format!("CONNECT answered with a {len}-byte body").into());
                }
                stream.write_all(origin_form.as_bytes()).await?;
            }
        }
        read_response(&mut stream, &mut self.buf).await
    }
}

async fn connect(addr: SocketAddr) -> Result<TcpStream> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Reads one response (head, then `Content-Length` bytes of body, discarded) and returns the body length.
/// Reads nothing past the body: the peer sends nothing more before the client's next request.
async fn read_response(stream: &mut TcpStream, buf: &mut [u8]) -> Result<u64> {
    let mut filled = 0;
    let head_end = loop {
        if let Some(pos) = buf[..filled].windows(4).position(|w| w == b"\r\n\r\n") {
            break pos + 4;
        }
        if filled == buf.len() {
            return Err("response head larger than the read buffer".into());
        }
        let n = stream.read(&mut buf[filled..]).await?;
        if n == 0 {
            return Err("connection closed before the response head was complete".into());
        }
        filled += n;
    };
    let head = String::from_utf8_lossy(&buf[..head_end]);
    let status = head.split(' ').nth(1).unwrap_or_default();
    if status != "200" {
        let line = head.lines().next().unwrap_or_default();
        return Err(format!("expected 200, got {line:?}").into());
    }
    let length: u64 = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<u64>()))
        .transpose()?
        .unwrap_or(0);
    let mut got = (filled - head_end) as u64;
    while got < length {
        let want = usize::try_from(length - got).unwrap_or(usize::MAX).min(buf.len());
        let n = stream.read(&mut buf[..want]).await?;
        if n == 0 {
            return Err(format!("connection closed after {got} of {length} body bytes").into());
        }
        got += n as u64;
    }
    if got != length {
        return Err(format!("read {got} body bytes, expected {length}").into());
    }
    Ok(length)
}
