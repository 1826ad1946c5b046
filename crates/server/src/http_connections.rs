//! Which of the API's open connections are idle, for the accept loop (`http_serve`): a connection is busy while a
//! request is in flight or its answer is still being sent (a streamed exec, an SSE log), idle otherwise (waiting for
//! its first request head or the next one). When every slot of `max_connections` is taken, the loop closes the
//! connection idle longest to take the next one, so clients spread over many addresses that open connections and never
//! finish a request cannot keep everyone else out until the header-read timeout; a busy connection is never closed.

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use tokio::sync::Notify;

/// One open connection as the accept loop sees it.
pub(crate) struct Connection {
    /// Requests in flight plus answers still being sent.
    busy: AtomicUsize,
    /// When it last became idle (or opened).
    idle_since: Mutex<Instant>,
    /// Notified to close it.
    close: Notify,
}

impl Connection {
    /// Completes when the accept loop asks this connection to close.
    pub(crate) async fn closing(&self) {
        self.close.notified().await;
    }
}

/// The open connections.
#[derive(Default)]
pub(crate) struct Connections {
    open: Mutex<HashMap<u64, Arc<Connection>>>,
    next: AtomicU64,
}

/// A connection's entry, removed when it is dropped (the connection ended).
pub(crate) struct Registered {
    connections: Arc<Connections>,
    id: u64,
    pub(crate) connection: Arc<Connection>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Ok(mut open) = self.connections.open.lock() {
            open.remove(&self.id);
        }
    }
}

impl Connections {
    /// Registers a new (idle) connection.
    pub(crate) fn register(self: &Arc<Self>) -> Registered {
        let connection = Arc::new(Connection {
            busy: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            close: Notify::new(),
        });
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut open) = self.open.lock() {
            open.insert(id, Arc::clone(&connection));
        }
        Registered { connections: Arc::clone(self), id, connection }
    }

    /// Asks the connection idle longest to close; false when every connection is busy.
    pub(crate) fn close_longest_idle(&self) -> bool {
        let Ok(open) = self.open.lock() else { return false };
        let idle_since = |c: &Connection| c.idle_since.lock().map(|at| *at).unwrap_or_else(|_| Instant::now());
        let longest = open.values().filter(|c| c.busy.load(Ordering::SeqCst) == 0).min_by_key(|c| idle_since(c));
        match longest {
            Some(connection) => {
                // Counted busy from now on, so it is not picked twice while it closes.
                connection.busy.fetch_add(1, Ordering::SeqCst);
                connection.close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Holds a connection busy until dropped.
struct Busy(Arc<Connection>);

impl Busy {
    fn new(connection: &Arc<Connection>) -> Busy {
        connection.busy.fetch_add(1, Ordering::SeqCst);
        Busy(Arc::clone(connection))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if self.0.busy.fetch_sub(1, Ordering::SeqCst) == 1
            && let Ok(mut at) = self.0.idle_since.lock()
        {
            *at = Instant::now();
        }
    }
}

/// An answer's body that keeps its connection busy until it is sent (or dropped).
struct BusyBody {
    inner: Body,
    _busy: Busy,
}

impl hyper::body::Body for BusyBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// `router` as the hyper service of `connection`: busy from each request's arrival until its answer is sent.
pub(crate) fn service(
    router: Router,
    connection: Arc<Connection>,
) -> impl hyper::service::Service<
    hyper::Request<Incoming>,
    Response = hyper::Response<Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<hyper::Response<Body>, Infallible>> + Send,
> + Clone {
    hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let busy = Busy::new(&connection);
        let answered = tower::ServiceExt::oneshot(router.clone(), request);
        async move {
            let response = answered.await?;
            Ok(response.map(|inner| Body::new(BusyBody { inner, _busy: busy })))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_idle_connection_is_closed_and_a_busy_one_never() {
        let connections = Arc::new(Connections::default());
        let oldest = connections.register();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let newer = connections.register();
        let busy = Busy::new(&oldest.connection);
        assert!(connections.close_longest_idle(), "the newer one is idle");
        assert_eq!(newer.connection.busy.load(Ordering::SeqCst), 1, "picked and marked so");
        assert!(!connections.close_longest_idle(), "the other is busy: nothing to close");
        drop(busy);
        assert!(connections.close_longest_idle(), "idle again once its answer is sent");
        drop((oldest, newer));
        assert!(connections.open.lock().is_ok_and(|open| open.is_empty()), "ended connections leave the registry");
    }
}
