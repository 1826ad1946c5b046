//! A stream wrapper that counts bytes each way and remembers when traffic last moved, and the idle watchdog
//! that uses it.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Byte counters and last-activity time of one or more streams.
#[derive(Debug)]
pub(crate) struct Counters {
    start: Instant,
    /// Bytes written through the wrapped stream(s).
    written: AtomicU64,
    /// Bytes read through the wrapped stream(s).
    read: AtomicU64,
    /// Milliseconds since `start` of the last read or write.
    last_ms: AtomicU64,
}

impl Counters {
    pub(crate) fn new() -> Arc<Counters> {
        Arc::new(Counters {
            start: Instant::now(),
            written: AtomicU64::new(0),
            read: AtomicU64::new(0),
            last_ms: AtomicU64::new(0),
        })
    }

    pub(crate) fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    pub(crate) fn read(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }

    fn touch(&self) {
        self.last_ms.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }
}

/// Returns once every one of `counters` has seen no traffic for `idle`.
pub(crate) async fn idle_watchdog(counters: Vec<Arc<Counters>>, idle: Duration) {
    loop {
        let quiet = counters.iter().map(|c| c.idle_for()).min().unwrap_or(idle);
        if quiet >= idle {
            return;
        }
        tokio::time::sleep(idle - quiet).await;
    }
}

/// A stream that counts its traffic in shared `Counters`.
#[derive(Debug)]
pub(crate) struct CountingIo<T> {
    inner: T,
    counters: Arc<Counters>,
}

impl<T> CountingIo<T> {
    pub(crate) fn new(inner: T, counters: Arc<Counters>) -> Self {
        counters.touch();
        CountingIo { inner, counters }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for CountingIo<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let res = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len().saturating_sub(before) as u64;
        if n > 0 {
            self.counters.read.fetch_add(n, Ordering::Relaxed);
            self.counters.touch();
        }
        res
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CountingIo<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = res
            && n > 0
        {
            self.counters.written.fetch_add(n as u64, Ordering::Relaxed);
            self.counters.touch();
        }
        res
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
