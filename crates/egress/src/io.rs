//! A stream wrapper that counts bytes each way and remembers when traffic last moved, and the idle watchdog
//! that uses it.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The bytes one sandbox moved through the proxy so far, all its connections together, live (a connection's own
/// counts reach the audit when it ends).
#[derive(Debug, Default)]
pub struct Traffic {
    up: AtomicU64,
    down: AtomicU64,
}

impl Traffic {
    /// Bytes sent upstream (sandbox → remote hosts).
    pub fn bytes_up(&self) -> u64 {
        self.up.load(Ordering::Relaxed)
    }

    /// Bytes received from upstream (remote hosts → sandbox): what the sandbox downloaded.
    pub fn bytes_down(&self) -> u64 {
        self.down.load(Ordering::Relaxed)
    }
}

/// Byte counters and last-activity time of one or more streams.
#[derive(Debug)]
pub(crate) struct Counters {
    start: Instant,
    /// The sandbox's traffic, which upstream streams add to (written = up, read = down).
    sandbox: Option<Arc<Traffic>>,
    /// Bytes written through the wrapped stream(s).
    written: AtomicU64,
    /// Bytes read through the wrapped stream(s).
    read: AtomicU64,
    /// Milliseconds since `start` of the last read or write.
    last_ms: AtomicU64,
}

impl Counters {
    pub(crate) fn new() -> Arc<Counters> {
        Self::with(None)
    }

    /// Counters of upstream streams, whose bytes count as `sandbox`'s traffic too.
    pub(crate) fn upstream_of(sandbox: Arc<Traffic>) -> Arc<Counters> {
        Self::with(Some(sandbox))
    }

    fn with(sandbox: Option<Arc<Traffic>>) -> Arc<Counters> {
        Arc::new(Counters {
            start: Instant::now(),
            sandbox,
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
            if let Some(sandbox) = &self.counters.sandbox {
                sandbox.down.fetch_add(n, Ordering::Relaxed);
            }
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
            if let Some(sandbox) = &self.counters.sandbox {
                sandbox.up.fetch_add(n as u64, Ordering::Relaxed);
            }
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
