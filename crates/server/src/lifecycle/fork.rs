//! Forking a sandbox: `count` new sandboxes alike (the source's spec — tier, template, limits, egress policy,
//! secrets, environment — its metadata and lifecycle), each admitted against the tenant's quota as a create is, then
//! the source's writable files copied into all of them at once (`copy`): the copies run fresh processes on the
//! source's files. A gVisor or microVM sandbox is forked with its memory instead (`memory_snapshot::fork_with_memory`: one
//! checkpoint, every copy restored from it, its processes running on). All or nothing: when one copy cannot be made,
//! none is kept.

use sandkasten_runtime::writable_dirs;

use crate::auth::Tenant;
use crate::lifecycle::copy::copy_files;
use crate::lifecycle::detached::to_completion;
use crate::lifecycle::error::LifecycleError;
use crate::lifecycle::memory_snapshot::fork_with_memory;
use crate::lifecycle::start::{abandon, start_sandbox};
use crate::state::AppState;
use crate::store::SandboxRecord;

/// The most copies one fork makes.
pub(crate) const MAX_FORK_COUNT: u64 = 16;

/// Makes `count` copies of the running sandbox `source`, each expiring at `expires_ms`; returns their rows.
pub(crate) async fn fork(
    state: &AppState,
    tenant: &Tenant,
    source: &SandboxRecord,
    count: u64,
    expires_ms: i64,
) -> Result<Vec<SandboxRecord>, LifecycleError> {
    // Its own task: a caller that goes away cannot leave copies nobody was told about.
    let (state, tenant, source) = (state.clone(), tenant.clone(), source.clone());
    to_completion(async move { fork_now(&state, &tenant, &source, count, expires_ms).await }).await
}

async fn fork_now(
    state: &AppState,
    tenant: &Tenant,
    source: &SandboxRecord,
    count: u64,
    expires_ms: i64,
) -> Result<Vec<SandboxRecord>, LifecycleError> {
    if !(1..=MAX_FORK_COUNT).contains(&count) {
        return Err(LifecycleError::ForkCountOutOfRange { max: MAX_FORK_COUNT, got: count });
    }
    if source.spec.tier().saves_memory() {
        let copies = fork_with_memory(state, tenant, source, count, expires_ms).await?;
        tracing::info!(sandbox = %source.id, tenant = %tenant.name, copies = copies.len(), "sandbox forked with memory");
        return Ok(copies);
    }
    let mut copies: Vec<SandboxRecord> = Vec::new();
    for _ in 0..count {
        let started =
            start_sandbox(state, tenant, source.spec.clone(), source.metadata.clone(), (expires_ms, source.lifecycle))
                .await;
        match started {
            Ok(copy) => copies.push(copy),
            Err(error) => {
                abandon_all(state, &copies).await;
                return Err(error);
            }
        }
    }
    let ids: Vec<String> = copies.iter().map(|copy| copy.id.clone()).collect();
    if let Err(failure) = copy_files(state, &source.id, writable_dirs(source.spec.template), &ids).await {
        abandon_all(state, &copies).await;
        return Err(LifecycleError::FilesNotCopied(format!(
            "copying the files of sandbox {} failed: {}; no copy was kept",
            source.id, failure.message
        )));
    }
    tracing::info!(sandbox = %source.id, tenant = %tenant.name, copies = ?ids, "sandbox forked");
    Ok(copies)
}

async fn abandon_all(state: &AppState, copies: &[SandboxRecord]) {
    for copy in copies {
        abandon(state, &copy.id).await;
    }
}
