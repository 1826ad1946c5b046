//! Expiry: a timeout becomes an expiry time ([`check_timeout`], for creates and timeout changes of the API and the
//! E2B facade), and the sweeper, once a second, destroys every running sandbox whose timeout has passed and marks it
//! expired, which frees its quota. A sandbox the runtime cannot destroy stays running and is retried next second.
//! The same tick marks lost the sandboxes the runtime reports dead on their own ([`sweep_lost`]).

use std::time::Duration;

use crate::clock::now_ms;
use crate::lifecycle::destroy::destroy_quietly;
use crate::lifecycle::error::LifecycleError;
use crate::metrics::ExitReason;
use crate::state::{AppState, Settings};
use crate::store::{SandboxState, StoreError};

/// The expiry (ms since the epoch) `timeout_s` seconds from now; `TimeoutOutOfRange` when out of range.
pub(crate) fn check_timeout(settings: Settings, timeout_s: u64) -> Result<i64, LifecycleError> {
    if !(1..=settings.max_timeout_s).contains(&timeout_s) {
        return Err(LifecycleError::TimeoutOutOfRange { max: settings.max_timeout_s, got: timeout_s });
    }
    Ok(now_ms().saturating_add(timeout_s as i64 * 1000))
}

/// How often the sweeper looks for expired sandboxes.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Destroys every running sandbox that expired at or before `now_ms` (pauses those created with `auto_pause`);
/// returns how many were expired.
pub async fn sweep(state: &AppState, now_ms: i64) -> Result<usize, StoreError> {
    let mut expired = 0;
    for record in state.store().expired_sandboxes(now_ms).await? {
        let id = record.id.as_str();
        if record.lifecycle.auto_pause && super::pause::pause_at_timeout(state, &record).await {
            continue;
        }
        if !destroy_quietly(state, id).await {
            continue;
        }
        if state.store().end_sandbox(id, SandboxState::Expired, "timeout", now_ms).await? {
            state.metrics().sandbox_exited(ExitReason::Expired);
            tracing::info!(sandbox = %id, "sandbox expired");
            expired += 1;
        }
    }
    Ok(expired)
}

/// Marks lost every sandbox the runtime reports dead on its own (its agent exited, or the spawner died with it), which
/// frees its quota; returns how many were running.
pub async fn sweep_lost(state: &AppState) -> Result<usize, StoreError> {
    let mut lost = 0;
    for sandkasten_runtime::LostSandbox { id, why } in state.runtime().take_lost() {
        let reason = why.map_or_else(|| "its processes died".to_owned(), |why| format!("its processes died: {why}"));
        if state.store().mark_lost(&id, &reason).await? {
            state.metrics().sandbox_exited(ExitReason::Lost);
            tracing::warn!(sandbox = %id, %reason, "sandbox lost");
            lost += 1;
        }
    }
    Ok(lost)
}

/// How often what ended is pruned from the database (`retention`).
const PRUNE_INTERVAL: Duration = Duration::from_secs(3600);

/// Removes from the store what ended longer ago than the retention (and ended sandboxes beyond its row cap).
pub async fn prune(state: &AppState, now_ms: i64) -> Result<crate::retention::Pruned, StoreError> {
    let retention = state.settings().retention;
    let cutoff = now_ms.saturating_sub(i64::try_from(retention.days.saturating_mul(86_400_000)).unwrap_or(i64::MAX));
    let pruned = state.store().prune(cutoff, retention.max_ended_sandboxes).await?;
    if pruned != crate::retention::Pruned::default() {
        tracing::info!(?pruned, days = retention.days, "pruned what ended before the retention");
    }
    Ok(pruned)
}

/// Sweeps every `SWEEP_INTERVAL` (and prunes the database and collects the snapshot store's garbage every
/// `PRUNE_INTERVAL`, first at start) until the task is aborted.
pub async fn run(state: AppState) {
    let mut interval = tokio::time::interval(SWEEP_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_prune: Option<std::time::Instant> = None;
    loop {
        interval.tick().await;
        if last_prune.is_none_or(|at| at.elapsed() >= PRUNE_INTERVAL) {
            last_prune = Some(std::time::Instant::now());
            if let Err(error) = prune(&state, now_ms()).await {
                tracing::error!(%error, "pruning the database failed");
            }
            // Chunks that deletes spared (younger than the store's grace) or crashes left go now.
            match state.snapshots().gc().await {
                Ok(report) if report.chunks_deleted > 0 || report.staging_files_deleted > 0 => {
                    tracing::info!(
                        chunks = report.chunks_deleted,
                        bytes = report.bytes_deleted,
                        staging_files = report.staging_files_deleted,
                        "snapshot store gc"
                    );
                }
                Ok(_) => {}
                Err(error) => tracing::error!(%error, "snapshot store gc failed"),
            }
        }
        if let Err(error) = sweep(&state, now_ms()).await {
            tracing::error!(%error, "expiry sweep failed");
        }
        if let Err(error) = sweep_lost(&state).await {
            tracing::error!(%error, "marking lost sandboxes failed");
        }
    }
}
