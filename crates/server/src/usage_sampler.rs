//! The usage sampler: every `[metrics] sample_interval_s` it reads what each running sandbox uses and adds it to the
//! sandbox's series in `UsageSamples`; [`sample`] takes one reading (also on each metrics request).

use std::time::Duration;

use crate::state::AppState;
use crate::store::{SandboxRecord, SandboxState};

/// Longest a reading of one sandbox may take (a sandbox busy being snapshotted answers late: skipped this time).
const READING_TIMEOUT: Duration = Duration::from_secs(2);

/// Reads what `sandbox` uses now and adds it to its series (`always`: even right after the last sample). `None`
/// when the runtime could not say (the sandbox is paused, ending, or busy past [`READING_TIMEOUT`]).
pub(crate) async fn sample(state: &AppState, sandbox: &SandboxRecord, always: bool) -> Option<()> {
    let reading = tokio::time::timeout(READING_TIMEOUT, state.runtime().usage(&sandbox.id)).await;
    match reading {
        Ok(Ok(usage)) => {
            state.usage_samples().add(sandbox, &usage, crate::clock::now_ms(), always);
            Some(())
        }
        Ok(Err(failure)) => {
            tracing::debug!(sandbox = %sandbox.id, %failure.message, "no usage reading");
            None
        }
        Err(_) => None,
    }
}

/// Samples every running sandbox each `interval`, until aborted; forgets the series of sandboxes that stopped.
pub async fn run(state: AppState, interval: Duration) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let running = match state.store().running_sandboxes().await {
            Ok(running) => running,
            Err(error) => {
                tracing::warn!(%error, "listing running sandboxes for usage samples failed");
                continue;
            }
        };
        // Paused sandboxes keep their series; nothing of them runs to sample.
        state.usage_samples().keep_only(&running);
        let unpaused = running.iter().filter(|sandbox| sandbox.state == SandboxState::Running);
        futures::future::join_all(unpaused.map(|sandbox| sample(&state, sandbox, true))).await;
    }
}
