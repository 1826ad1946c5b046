//! The proxy: shared state (resolver, upstream TLS, audit sink), the per-sandbox accept loop, and the handle
//! whose drop ends the loop and every connection it started.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::ClientConfig;
use tokio::net::TcpListener;

use crate::entrance::{ClientStream, Entrance, Listener};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::audit::AuditSink;
use crate::config::{ConfigError, EgressConfig};
use crate::io::{Counters, CountingIo, idle_watchdog};
use crate::resolve::Resolver;
use crate::response::Body;
use crate::sandbox::SandboxEgress;
use crate::{forward, tls, tunnel};

/// Largest request head (request line + headers) accepted from a sandbox, bytes.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// How long a client may take to send a complete request head (slow-header clients are cut off).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The egress proxy. Cheap to clone; one per server, serving any number of sandboxes.
#[derive(Clone)]
pub struct Proxy {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) resolver: Resolver,
    pub(crate) client_tls: Arc<ClientConfig>,
    pub(crate) audit: Arc<dyn AuditSink>,
    pub(crate) connect_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) max_connections: usize,
    /// Slots of all sandboxes' client connections together (`max_total_connections`).
    pub(crate) total_slots: Arc<Semaphore>,
    /// Slots of each tenant's sandboxes together (`max_tenant_connections`), while a sandbox of it serves.
    tenant_slots: std::sync::Mutex<std::collections::HashMap<String, std::sync::Weak<Semaphore>>>,
    max_tenant_connections: usize,
}

impl Inner {
    /// The slots of `tenant`'s sandboxes (made when none of its sandboxes serves).
    fn tenant_slots(&self, tenant: &str) -> Arc<Semaphore> {
        let Ok(mut map) = self.tenant_slots.lock() else {
            return Arc::new(Semaphore::new(self.max_tenant_connections));
        };
        if let Some(slots) = map.get(tenant).and_then(std::sync::Weak::upgrade) {
            return slots;
        }
        map.retain(|_, slots| slots.strong_count() > 0);
        let slots = Arc::new(Semaphore::new(self.max_tenant_connections));
        map.insert(tenant.to_owned(), Arc::downgrade(&slots));
        slots
    }
}

/// A client connection's slots: its sandbox's, its tenant's and the proxy-wide one, all freed when it closes.
pub(crate) struct Slot {
    _sandbox: OwnedSemaphorePermit,
    _tenant: OwnedSemaphorePermit,
    _total: OwnedSemaphorePermit,
}

/// Everything a connection's handlers need.
#[derive(Clone)]
pub(crate) struct Ctx {
    pub(crate) inner: Arc<Inner>,
    pub(crate) sandbox: Arc<SandboxEgress>,
    pub(crate) tasks: Tasks,
    /// This client connection's slots under `max_connections` and `max_total_connections`, held until the
    /// connection and any tunnel it opened are closed.
    #[expect(dead_code, reason = "held only so that dropping it frees the slots")]
    pub(crate) slot: Option<Arc<Slot>>,
}

/// The tasks of one `serve` call: all are cancelled together.
#[derive(Clone)]
pub(crate) struct Tasks {
    tracker: TaskTracker,
    token: CancellationToken,
}

impl Tasks {
    /// Spawns `fut`, dropped (closing its sockets) when the handle is dropped or shut down.
    pub(crate) fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        let token = self.token.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                _ = token.cancelled() => {}
                _ = fut => {}
            }
        });
    }
}

impl Proxy {
    /// Validates the configuration and loads the upstream TLS roots (system roots plus `upstream_ca_file`).
    pub fn new(config: EgressConfig, audit: Arc<dyn AuditSink>) -> Result<Proxy, ConfigError> {
        let valid = config.validate()?;
        let client_tls = tls::upstream_client_config(config.upstream_ca_file.as_deref())?;
        let resolver = Resolver::new(valid.hosts, valid.allow_cidrs, valid.connect_timeout);
        Ok(Proxy {
            inner: Arc::new(Inner {
                resolver,
                client_tls,
                audit,
                connect_timeout: valid.connect_timeout,
                idle_timeout: valid.idle_timeout,
                max_connections: valid.max_connections,
                total_slots: Arc::new(Semaphore::new(valid.max_total_connections)),
                tenant_slots: std::sync::Mutex::default(),
                max_tenant_connections: valid.max_tenant_connections,
            }),
        })
    }

    /// Serves one sandbox's listener until the returned handle is dropped or shut down. Must be called within
    /// a tokio runtime.
    pub fn serve(&self, listener: TcpListener, sandbox: Arc<SandboxEgress>) -> ProxyHandle {
        self.serve_entrance(Listener::Tcp(listener), sandbox)
    }

    /// Serves one sandbox's entrance (its TCP listener or unix socket) like `serve`.
    pub fn serve_at(&self, entrance: Entrance, sandbox: Arc<SandboxEgress>) -> std::io::Result<ProxyHandle> {
        Ok(self.serve_entrance(Listener::new(entrance)?, sandbox))
    }

    fn serve_entrance(&self, listener: Listener, sandbox: Arc<SandboxEgress>) -> ProxyHandle {
        let tasks = Tasks { tracker: TaskTracker::new(), token: CancellationToken::new() };
        let ctx = Ctx { inner: self.inner.clone(), sandbox, tasks: tasks.clone(), slot: None };
        let accept = tokio::spawn(accept_loop(listener, ctx));
        ProxyHandle { tasks, accept: Some(accept) }
    }
}

/// Owns one sandbox's accept loop and connections. Dropping it closes the listener and every connection and
/// tunnel of that sandbox (asynchronously); `shutdown` does the same and waits until all are gone.
pub struct ProxyHandle {
    tasks: Tasks,
    accept: Option<JoinHandle<()>>,
}

impl ProxyHandle {
    /// Stops accepting, closes every connection, and returns once all of them are closed.
    pub async fn shutdown(mut self) {
        self.tasks.token.cancel();
        if let Some(accept) = self.accept.take() {
            accept.abort();
            let _ = accept.await;
        }
        self.tasks.tracker.close();
        self.tasks.tracker.wait().await;
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        self.tasks.token.cancel();
        self.tasks.tracker.close();
        if let Some(accept) = self.accept.take() {
            accept.abort();
        }
    }
}

async fn accept_loop(listener: Listener, ctx: Ctx) {
    let slots = Arc::new(Semaphore::new(ctx.inner.max_connections));
    let tenant = ctx.inner.tenant_slots(&ctx.sandbox.tenant);
    loop {
        let accepted = tokio::select! {
            _ = ctx.tasks.token.cancelled() => return,
            accepted = accept_with_slot(&listener, [&slots, &tenant, &ctx.inner.total_slots]) => accepted,
        };
        match accepted {
            Ok((stream, slot)) => {
                let conn_ctx = Ctx { slot: Some(Arc::new(slot)), ..ctx.clone() };
                ctx.tasks.spawn(serve_client(conn_ctx, stream));
            }
            Err(e) => {
                // Out of descriptors or a transient error: back off instead of spinning.
                tracing::warn!(sandbox = %ctx.sandbox.sandbox_id, error = %e, "egress proxy accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Waits for a free connection slot of the sandbox, of its tenant and of the proxy (in that order, the same for every
/// sandbox, so no two wait on each other), then for a connection.
async fn accept_with_slot(
    listener: &Listener,
    [sandbox, tenant, total]: [&Arc<Semaphore>; 3],
) -> std::io::Result<(ClientStream, Slot)> {
    let acquire = |slots: &Arc<Semaphore>| Arc::clone(slots).acquire_owned();
    let own = acquire(sandbox).await.map_err(std::io::Error::other)?;
    let tenant = acquire(tenant).await.map_err(std::io::Error::other)?;
    let shared = acquire(total).await.map_err(std::io::Error::other)?;
    let stream = listener.accept().await?;
    Ok((stream, Slot { _sandbox: own, _tenant: tenant, _total: shared }))
}

/// Serves HTTP/1.1 proxy requests on one client connection.
async fn serve_client(ctx: Ctx, stream: ClientStream) {
    let counters = Counters::new();
    let io = TokioIo::new(CountingIo::new(stream, counters.clone()));
    let idle = ctx.inner.idle_timeout;
    let svc_ctx = ctx.clone();
    let service = service_fn(move |req| {
        let ctx = svc_ctx.clone();
        async move { Ok::<_, Infallible>(handle(ctx, req).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .max_header_size(MAX_HEAD_BYTES)
        .serve_connection(io, service)
        .with_upgrades();
    tokio::select! {
        res = conn => {
            if let Err(e) = res {
                tracing::debug!(sandbox = %ctx.sandbox.sandbox_id, error = %e, "egress client connection ended");
            }
        }
        _ = idle_watchdog(vec![counters], idle) => {}
    }
}

async fn handle(ctx: Ctx, req: Request<Incoming>) -> Response<Body> {
    if req.method() == Method::CONNECT {
        tunnel::handle_connect(ctx, req).await
    } else {
        forward::handle_http(ctx, req).await
    }
}
