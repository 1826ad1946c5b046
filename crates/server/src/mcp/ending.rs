//! Killing what ended MCP sessions leave: their sandboxes not created with `persist` (as the session's tenant).

use crate::lifecycle::end_running;
use crate::mcp::sessions::Leftovers;
use crate::state::AppState;

/// Kills the sandboxes (one that has ended already is left as it is).
pub(crate) async fn kill(leftovers: Leftovers, state: &AppState) {
    let Leftovers { tenant, sandboxes } = leftovers;
    for id in sandboxes {
        match end_running(state, &tenant, &id).await {
            Ok(()) => tracing::info!(sandbox = %id, tenant = %tenant.name, "mcp session ended: sandbox killed"),
            Err(error) => tracing::debug!(sandbox = %id, %error, "mcp session ended: sandbox not killed"),
        }
    }
}

/// Kills what every open session created (not `persist`), when the server stops.
pub(crate) async fn close_all(state: &AppState) {
    for leftovers in state.mcp_sessions().close_all() {
        kill(leftovers, state).await;
    }
}
