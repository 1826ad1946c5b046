//! The benchmark's upstream: a minimal HTTP/1.1 server on 127.0.0.1 that reads one request head per
//! connection and answers `GET /small` with a few bytes or `GET /big` with a fixed number of zero bytes, then
//! closes (the proxy sends `Connection: close` upstream anyway, so every request is one connection).

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Body of `GET /small`.
pub const SMALL_BODY: &[u8] = b"hello, world\n";
/// Size of each write of the `/big` body.
const CHUNK: usize = 1024 * 1024;
/// Largest request head read.
const MAX_HEAD: usize = 8 * 1024;

/// Accepts connections until the runtime stops; `big` is the size of the `/big` body in bytes.
pub async fn serve(listener: TcpListener, big: u64) {
    let chunk: Arc<[u8]> = vec![0u8; CHUNK].into();
    while let Ok((stream, _)) = listener.accept().await {
        let chunk = chunk.clone();
        tokio::spawn(async move {
            if let Err(e) = answer(stream, big, &chunk).await {
                eprintln!("egress_bench: upstream: {e}");
            }
        });
    }
}

async fn answer(mut stream: TcpStream, big: u64, chunk: &[u8]) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 || head.len() + n > MAX_HEAD {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    if line.starts_with(b"GET /small ") {
        let mut resp = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", SMALL_BODY.len())
            .into_bytes();
        resp.extend_from_slice(SMALL_BODY);
        stream.write_all(&resp).await?;
    } else if line.starts_with(b"GET /big ") {
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {big}\r\nConnection: close\r\n\r\n");
        stream.write_all(head.as_bytes()).await?;
        let mut left = big;
        while left > 0 {
            let n = usize::try_from(left).unwrap_or(usize::MAX).min(chunk.len());
            stream.write_all(&chunk[..n]).await?;
            left -= n as u64;
        }
    } else {
        stream.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await?;
    }
    stream.shutdown().await
}
