//! The startup reconcile: the config's tenants are recorded in the store; every sandbox the store says is running but
//! whose processes the runtime no longer has (the daemon was killed, the host rebooted) is marked lost, and the
//! runtime is asked to remove what is left of it, except a sandbox paused to the filesystem, which needs no processes
//! and stays paused; every command still recorded as running is marked ended, `lost`
//! (the server that watched it is gone, so its end would never be recorded).

use crate::clock::now_ms;
use crate::lifecycle::destroy::destroy_quietly;
use crate::metrics::ExitReason;
use crate::state::AppState;
use crate::store::StoreError;

/// Records every configured tenant (and `default` when authentication is off) in the store.
pub async fn register_tenants(state: &AppState) -> Result<usize, StoreError> {
    let tenants: Vec<_> = state.keyring().tenants().map(|tenant| (tenant.name.to_string(), tenant.quota)).collect();
    let count = tenants.len();
    state.store().upsert_tenants(tenants, now_ms()).await?;
    Ok(count)
}

/// Marks dead sandboxes lost and cleans up after them, and marks commands left running lost; returns how many
/// sandboxes were lost.
pub async fn reconcile(state: &AppState) -> Result<usize, StoreError> {
    let mut lost = 0;
    for record in state.store().running_sandboxes().await? {
        if state.runtime().is_alive(&record.id) {
            continue;
        }
        destroy_quietly(state, &record.id).await;
        if record.pause_snapshot.is_some() {
            // Paused to the filesystem, its files in the store: it stays paused (a resume the crash cut short is
            // paused again on the same files).
            if record.paused_ms.is_none() {
                state.store().pause_sandbox(&record.id, now_ms()).await?;
            }
            tracing::info!(sandbox = %record.id, tenant = %record.tenant, "sandbox stays paused on its saved files");
            continue;
        }
        if state.store().mark_lost(&record.id, "not alive when the server started").await? {
            state.metrics().sandbox_exited(ExitReason::Lost);
            tracing::warn!(sandbox = %record.id, tenant = %record.tenant, "sandbox lost");
            lost += 1;
        }
    }
    let commands = state.store().mark_running_commands_lost(now_ms()).await?;
    if commands > 0 {
        tracing::warn!(commands, "commands still recorded as running marked lost");
    }
    Ok(lost)
}
