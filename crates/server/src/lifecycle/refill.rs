//! The warm pools' side of the lifecycle: the refill task that creates members (and starts their zygote and spare
//! kernel), a resize that destroys the ready members past a lower `max`, the replacement of a pool's members when
//! its template was rebuilt, and the destruction of idle members at shutdown. The bookkeeping (what to create,
//! claims, sizes) is `pool`'s; the sandboxes are made and destroyed here.

use std::time::{Duration, Instant};

use sandkasten_types::{CodeLanguage, CommandSpec, Failure, FailureKind};

use crate::ids;
use crate::lifecycle::destroy::destroy_quietly;
use crate::pool::{Fill, Member, PoolStatus};
use crate::state::AppState;

/// Time limit of a zygote command: it waits in an idle member for as long as the member is not claimed; a run
/// enforces its own time limit.
const ZYGOTE_TIMEOUT_MS: u64 = 365 * 24 * 3600 * 1000;
/// How often the refill task looks for dead members when nothing wakes it.
const CHECK_EVERY: Duration = Duration::from_millis(200);
/// How often the pools' templates are resolved again (a rebuilt one replaces the pool's members).
const TEMPLATES_EVERY: Duration = Duration::from_secs(2);
/// Pause after a failed creation before the next attempt.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The refill task: keeps every pool of `state` filled to its target, and its members made of its template as built
/// now; runs until aborted (`serve_on` spawns it).
pub async fn run(state: AppState) {
    let (pools, metrics) = (state.pools(), state.metrics());
    pools.report_all(metrics);
    let mut templates_looked_at = Instant::now();
    loop {
        pools.prune(state.runtime(), metrics);
        if pools.follows_templates() && templates_looked_at.elapsed() >= TEMPLATES_EVERY {
            templates_looked_at = Instant::now();
            follow_templates(&state).await;
        }
        let Some(fill) = pools.next_fill() else {
            pools.wait_for_change(CHECK_EVERY).await;
            continue;
        };
        let Fill { spec, zygote, spare, .. } = fill.clone();
        let started = Instant::now();
        let created = match ids::sandbox_id() {
            Ok(id) => state.runtime().create(&id, &spec).await.map(|()| id).map_err(|f| f.message),
            Err(error) => Err(error.to_string()),
        };
        let created = match (created, zygote) {
            (Ok(id), Some(argv)) => start_zygote(&state, &id, argv, spec.limits.output_bytes).await,
            (created, None) => created.map(|id| Member { id, zygote: None }),
            (Err(reason), Some(_)) => Err(reason),
        };
        if let (Ok(member), Some((language, preload))) = (&created, spare) {
            prepare_spare(&state, &member.id, language, preload).await;
        }
        match created {
            Ok(member) => {
                metrics.pool_refilled(started.elapsed().as_secs_f64());
                if let Some(surplus) = pools.fill_finished(&fill, Some(member), metrics) {
                    destroy_quietly(&state, &surplus).await;
                }
            }
            Err(reason) => {
                pools.fill_finished(&fill, None, metrics);
                tracing::warn!(%reason, "creating a pool sandbox failed; retrying shortly");
                tokio::time::sleep(RETRY_AFTER).await;
            }
        }
    }
}

/// Makes the pools whose template was rebuilt make their members of the new one, destroying their ready members of
/// the old.
async fn follow_templates(state: &AppState) {
    let looking = state.clone();
    // A template removal between reading a rebuilt template and switching the pool to it would not see its layers
    // as the pool's.
    let holding = state.holding_templates().await;
    let stale = tokio::task::spawn_blocking(move || {
        let _holding = holding;
        looking.pools().follow_templates(&looking.effective_config().templates, looking.metrics())
    })
    .await
    .unwrap_or_default();
    for id in stale {
        destroy_quietly(state, &id).await;
    }
}

/// Starts a new member's spare code-context kernel; a failure leaves the member without one (its contexts start
/// cold).
async fn prepare_spare(state: &AppState, id: &str, language: CodeLanguage, preload: Vec<String>) {
    if let Err(failure) = state.runtime().prepare_context(id, language, preload).await {
        tracing::warn!(sandbox = %id, reason = %failure.message, "starting a spare kernel failed; contexts start cold");
    }
}

/// Starts a new member's zygote; on failure the member is destroyed.
async fn start_zygote(state: &AppState, id: &str, argv: Vec<String>, output_limit: u64) -> Result<Member, String> {
    let spec = CommandSpec { argv: Some(argv), timeout_ms: Some(ZYGOTE_TIMEOUT_MS), ..CommandSpec::default() };
    let started = match ids::command_id() {
        Ok(command) => {
            let retention = state.output_budgets().retention_unowned(output_limit);
            state.runtime().start_command(id, &command, spec, retention).await.map(|_| command)
        }
        Err(error) => Err(Failure::new(FailureKind::Internal, error.to_string())),
    };
    match started {
        Ok(command) => Ok(Member { id: id.to_owned(), zygote: Some(command) }),
        Err(failure) => {
            destroy_quietly(state, id).await;
            Err(format!("starting the zygote failed: {}", failure.message))
        }
    }
}

/// Sets the sizes of pool `name` (validated by the caller: `min <= max`) and destroys the ready members past the new
/// `max`; the pool's new status and how many were destroyed, or `None` when there is no such pool.
pub(crate) async fn resize(state: &AppState, name: &str, min: usize, max: usize) -> Option<(PoolStatus, usize)> {
    let (status, surplus) = state.pools().resize(name, min, max, state.metrics())?;
    for id in &surplus {
        destroy_quietly(state, id).await;
    }
    Some((status, surplus.len()))
}

/// Destroys every idle pool member (at shutdown: they belong to nobody).
pub(crate) async fn destroy_idle(state: &AppState) {
    for id in state.pools().drain() {
        destroy_quietly(state, &id).await;
    }
}
