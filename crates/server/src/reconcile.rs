//! The startup reconcile: every sandbox the store says is running but whose processes the runtime no longer has
//! (the daemon was killed, the host rebooted) is marked lost, and the runtime is asked to remove what is left of it.

use crate::api::destroy_quietly;
use crate::state::AppState;
use crate::store::StoreError;

/// Marks dead sandboxes lost and cleans up after them; returns how many were lost.
pub async fn reconcile(state: &AppState) -> Result<usize, StoreError> {
    let mut lost = 0;
    for record in state.store().running_sandboxes().await? {
        if state.runtime().is_alive(&record.id) {
            continue;
        }
        destroy_quietly(state, &record.id).await;
        if state.store().mark_lost(&record.id, "not alive when the server started").await? {
            tracing::warn!(sandbox = %record.id, tenant = %record.tenant, "sandbox lost");
            lost += 1;
        }
    }
    Ok(lost)
}
