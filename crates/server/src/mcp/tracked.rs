//! rmcp's in-memory session manager, with each session's start and end reported to `McpSessions`: a session is
//! recorded as the authenticated tenant's when it is created (inside the `initialize` request, whose tenant the
//! middleware put in `CALLER`), and `close_session` — called for a client's `DELETE`, and by rmcp itself when a
//! session's worker ends (idle expiry, server shutdown) — kills what it created.

use futures::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, LocalSessionManagerError};
use rmcp::transport::streamable_http_server::session::{ServerSseMessage, SessionId};

use crate::auth::Tenant;
use crate::state::AppState;

tokio::task_local! {
    /// The tenant of the `/mcp` request being handled (set by the middleware around rmcp's service).
    pub(crate) static CALLER: Tenant;
}

/// `LocalSessionManager` reporting to the server's `McpSessions`.
pub(crate) struct TrackedSessions {
    inner: LocalSessionManager,
    state: AppState,
}

impl TrackedSessions {
    /// Sessions that end after `idle` without a request.
    pub(crate) fn new(state: AppState, idle: std::time::Duration) -> Self {
        let mut inner = LocalSessionManager::default();
        inner.session_config.keep_alive = Some(idle);
        TrackedSessions { inner, state }
    }
}

/// Why a session could not be created (no tenant: the middleware did not run).
#[derive(Debug, thiserror::Error)]
pub(crate) enum TrackedError {
    /// rmcp's own.
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
    /// A session was asked for outside an authenticated `/mcp` request.
    #[error("no authenticated tenant for a new MCP session")]
    NoTenant,
}

impl SessionManager for TrackedSessions {
    type Error = TrackedError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let tenant = CALLER.try_with(Tenant::clone).map_err(|_| TrackedError::NoTenant)?;
        let (id, transport) = self.inner.create_session().await?;
        tracing::info!(session = %id, tenant = %tenant.name, "mcp session opened");
        self.state.mcp_sessions().open(id.clone(), tenant);
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        Ok(self.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        let closed = self.inner.close_session(id).await;
        if let Some(leftovers) = self.state.mcp_sessions().close(id) {
            tracing::info!(session = %id, "mcp session closed");
            crate::mcp::ending::kill(leftovers, &self.state).await;
        }
        Ok(closed?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_stream(id, message).await?)
    }

    async fn accept_message(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<(), Self::Error> {
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.resume(id, last_event_id).await?)
    }
}
