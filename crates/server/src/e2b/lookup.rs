//! How the control plane finds what a request names: the caller's sandbox in the state an operation needs (E2B
//! does not tell an unknown, foreign or ended sandbox apart: all are `sandbox_not_found`), and the E2B template
//! names the facade serves.

use crate::auth::Tenant;
use crate::e2b::error::{Code, E2bError};
use crate::lifecycle;
use crate::state::AppState;
use crate::store::{SandboxRecord, SandboxState};

/// E2B templates a facade sandbox may ask for; all of them are sandkasten's `e2b` template (the host's `/usr`,
/// user `user` with its home at `/home/user`). `mcp-gateway` is what the SDK asks for with `mcp` (it has no gateway
/// here: starting it fails as a failed gateway does).
pub(crate) const TEMPLATES: &[&str] = &["base", "code-interpreter-v1", "code-interpreter", "host", "mcp-gateway"];

/// The tenant's sandbox `id` while it runs (`sandbox_not_found` otherwise, paused included).
pub(crate) async fn running(state: &AppState, tenant: &Tenant, id: &str) -> Result<SandboxRecord, E2bError> {
    let record = live(state, tenant, id).await?;
    if record.state != SandboxState::Running {
        return Err(E2bError::sandbox_not_found(id));
    }
    Ok(record)
}

/// The tenant's running sandbox `id` for an operation on its files (a snapshot, a fork): a paused one is resumed
/// when it was created with `autoResume`, and refused otherwise; an unknown or ended one is `sandbox_not_found`.
pub(crate) async fn usable(state: &AppState, tenant: &Tenant, id: &str) -> Result<SandboxRecord, E2bError> {
    state.transitions().settled(id).await;
    let record = live(state, tenant, id).await?;
    if record.state == SandboxState::Paused {
        if !record.lifecycle.auto_resume {
            return Err(E2bError::new(
                Code::FailedPrecondition,
                format!("sandbox {id} is paused: resume it first (Sandbox.connect resumes a paused sandbox)"),
            ));
        }
        lifecycle::ensure_resumed(state, tenant, id).await?;
    }
    running(state, tenant, id).await
}

/// The tenant's sandbox `id` while it is running or paused (`sandbox_not_found` otherwise).
pub(crate) async fn live(state: &AppState, tenant: &Tenant, id: &str) -> Result<SandboxRecord, E2bError> {
    if !crate::ids::is_sandbox_id(id) {
        return Err(E2bError::sandbox_not_found(id));
    }
    let record = state.store().sandbox(&tenant.name, id).await.map_err(crate::api::error::ApiError::from)?;
    record
        .filter(|r| matches!(r.state, SandboxState::Running | SandboxState::Paused))
        .ok_or_else(|| E2bError::sandbox_not_found(id))
}
