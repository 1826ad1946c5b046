//! The API's accept loop. `axum::serve` has no header-read timeout and no connection cap: clients that never finish
//! their request head stayed open until the server ran out of descriptors (and `/healthz` with it). Here every
//! connection is served by hyper's HTTP/1 with a header-read timeout (a connection whose request head does not arrive
//! in time is closed, between keep-alive requests too); at most `max_connections` are open at once (beyond it the
//! loop closes the connection idle longest, see `http_connections`, or, when all are busy, stops accepting and the
//! kernel's backlog holds the rest until one closes) and at most `max_connections_per_client` from one address (more
//! are closed at once), so one client cannot take them all. At shutdown the loop stops accepting, asks every
//! connection to finish its request in flight, and waits for them.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use crate::config::HttpConfig;
use crate::http_connections::Connections;

/// Largest request head (request line and headers), in bytes.
const MAX_HEAD_BYTES: usize = 64 << 10;

/// Open connections per client address.
#[derive(Default)]
struct PerClient(Mutex<HashMap<IpAddr, usize>>);

/// One client's share of the connections, returned when the connection ends.
struct ClientSlot {
    clients: Arc<PerClient>,
    addr: IpAddr,
}

impl PerClient {
    /// A slot for `addr`, unless it holds `max` connections already.
    fn take(self: &Arc<Self>, addr: IpAddr, max: usize) -> Option<ClientSlot> {
        let mut open = self.0.lock().ok()?;
        let count = open.entry(addr).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(ClientSlot { clients: Arc::clone(self), addr })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        if let Ok(mut open) = self.clients.0.lock()
            && let Some(count) = open.get_mut(&self.addr)
        {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.addr);
            }
        }
    }
}

/// Serves `router` on `listener` until `shutdown` completes, then waits for the requests in flight.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let clients = Arc::new(PerClient::default());
    let connections = Arc::new(Connections::default());
    let (closing, closed) = watch::channel(false);
    let header_timeout = Duration::from_millis(limits.header_read_timeout_ms);
    tokio::pin!(shutdown);
    loop {
        let permit = match Arc::clone(&open).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                // Every slot is taken: the connection idle longest makes room (its permit comes back as it ends).
                connections.close_longest_idle();
                tokio::select! {
                    () = &mut shutdown => break,
                    permit = Arc::clone(&open).acquire_owned() => permit.map_err(std::io::Error::other)?,
                }
            }
        };
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // EMFILE and friends: the connection stays in the backlog; try again shortly.
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(slot) = clients.take(peer.ip(), limits.max_connections_per_client) else {
            tracing::debug!(client = %peer.ip(), "too many connections from one client; closing the new one");
            continue;
        };
        let registered = connections.register();
        let service = crate::http_connections::service(router.clone(), Arc::clone(&registered.connection));
        let mut closed = closed.clone();
        tokio::spawn(async move {
            let _held = (permit, slot);
            let connection_state = Arc::clone(&registered.connection);
            let _registered = registered;
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .max_buf_size(MAX_HEAD_BYTES)
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            tokio::pin!(connection);
            let ended = tokio::select! {
                ended = connection.as_mut() => ended,
                _ = closed.changed() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
                () = connection_state.closing() => {
                    tracing::debug!(client = %peer.ip(), "closing an idle connection to make room for a new one");
                    Ok(())
                }
            };
            if let Err(error) = ended {
                tracing::debug!(%error, "connection ended");
            }
        });
    }
    let _ = closing.send(true);
    // Every connection holds a permit until it ends: all of them back means none is left.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _drained = open.acquire_many(all).await.map_err(std::io::Error::other)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_gets_at_most_its_share_and_gets_it_back_when_a_connection_ends() {
        let clients = Arc::new(PerClient::default());
        let (a, b) = (IpAddr::from([127, 0, 0, 1]), IpAddr::from([127, 0, 0, 2]));
        let first = clients.take(a, 2);
        let second = clients.take(a, 2);
        assert!(first.is_some() && second.is_some());
        assert!(clients.take(a, 2).is_none(), "a third connection from one client");
        assert!(clients.take(b, 2).is_some(), "another client has its own share");
        drop(first);
        assert!(clients.take(a, 2).is_some(), "an ended connection gives its slot back");
    }
}
