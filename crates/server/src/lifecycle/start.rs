//! Starting a sandbox: its isolation tier resolved (the request's, else the server's default) and refused when it
//! cannot run here, its egress prepared, a warm pool member claimed when one serves its spec, its row admitted
//! against the tenant's quota, the sandbox created in the runtime (unless claimed), and its egress door opened. On
//! any failure nothing of it remains.

use std::collections::BTreeMap;
use std::time::Instant;

use sandkasten_types::{Isolation, SandboxSpec, Tier, Workload};

use crate::auth::Tenant;
use crate::clock::now_ms;
use crate::config::ZygoteKind;
use crate::lifecycle::auto_isolation::{self, HostTiers};
use crate::lifecycle::destroy::destroy_quietly;
use crate::lifecycle::error::LifecycleError;
use crate::pool::Claim;
use crate::state::AppState;
use crate::store::{Lifecycle, SandboxRecord, SandboxState};
use crate::{egress, ids};

/// SIGKILL.
pub(crate) const SIGKILL: i32 = 9;

/// The tier a create runs on and why: `requested` (`auto`: chosen by `[isolation.auto]` for `tenant`'s trust and
/// `workload`), else the server's default; `TierUnavailable` when this build or this host's runtime cannot run it,
/// with the runtime's word on what to install. A microVM's `accel` is the runtime's (as it will start it).
pub(crate) fn resolve_isolation(
    state: &AppState,
    tenant: &Tenant,
    requested: Option<Tier>,
    workload: &Workload,
) -> Result<Isolation, LifecycleError> {
    let runtime = state.runtime();
    let unusable = |tier: Tier| tier.unavailable_reason().map(str::to_owned).or_else(|| runtime.tier_unavailable(tier));
    let chosen = match requested {
        Some(Tier::Auto) => {
            let host = HostTiers {
                unusable: Tier::CREATABLE
                    .into_iter()
                    .filter_map(|tier| unusable(tier).map(|why| (tier, why)))
                    .collect(),
                microvm_accel: runtime.tier_accel(Tier::Microvm),
            };
            return auto_isolation::choose(state.auto_isolation(), tenant.trust, workload, &host)
                .map_err(LifecycleError::TierUnavailable);
        }
        Some(tier) => Isolation::new(tier, Isolation::REQUESTED),
        None => Isolation::new(state.settings().isolation, Isolation::SERVER_DEFAULT),
    };
    match unusable(chosen.tier) {
        Some(reason) => Err(LifecycleError::TierUnavailable(reason)),
        None => Ok(Isolation { accel: runtime.tier_accel(chosen.tier), ..chosen }),
    }
}

/// The most processes one sandbox may have: the runtime's cap for this host, lowered by the config's `max_pids`.
pub(crate) fn pids_cap(configured: Option<u64>, runtime: &dyn sandkasten_runtime::SandboxRuntime) -> u64 {
    let host = runtime.max_pids();
    configured.map_or(host, |configured| configured.min(host))
}

/// Refuses `pids` above the cap, naming it and where it comes from.
fn check_pids(state: &AppState, pids: u64) -> Result<(), LifecycleError> {
    let host = state.runtime().max_pids();
    let cap = pids_cap(state.settings().max_pids, state.runtime());
    if pids <= cap {
        return Ok(());
    }
    let message = if cap < host {
        format!("limits.pids is {pids}; this server allows at most {cap} per sandbox (max_pids); ask for fewer")
    } else {
        sandkasten_runtime::pids_refusal(pids, cap)
    };
    Err(LifecycleError::TooManyPids(message))
}

/// Resolves the sandbox's isolation tier (the spec's, else the server's default; refused when it cannot run here),
/// admits the sandbox against the tenant's quota, records it and starts it in the runtime (or takes a ready one from
/// a warm pool serving its spec, tier included); on any failure nothing of it remains. Returns the running sandbox's
/// row. A pool member's zygote is not for the caller: it is killed.
pub(crate) async fn start_sandbox(
    state: &AppState,
    tenant: &Tenant,
    spec: SandboxSpec,
    metadata: BTreeMap<String, String>,
    (expires_ms, lifecycle): (i64, Lifecycle),
) -> Result<SandboxRecord, LifecycleError> {
    let (record, zygote) = start_sandbox_with_zygote(state, tenant, spec, metadata, (expires_ms, lifecycle)).await?;
    if let Some((_, zygote)) = zygote
        && let Err(failure) = state.runtime().signal_command(&record.id, &zygote, SIGKILL).await
    {
        tracing::warn!(sandbox = %record.id, reason = %failure.message, "could not stop an unused zygote");
    }
    Ok(record)
}

/// How the runtime makes a new sandbox.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Birth<'a> {
    /// Fresh from its spec (or a warm pool member of that spec).
    Fresh,
    /// From the memory snapshot in this directory (never a pool member).
    Memory(&'a std::path::Path),
}

/// As [`start_sandbox`], keeping the zygote of a pool member: its kind and command id, when there is one.
pub(crate) async fn start_sandbox_with_zygote(
    state: &AppState,
    tenant: &Tenant,
    spec: SandboxSpec,
    metadata: BTreeMap<String, String>,
    expiry: (i64, Lifecycle),
) -> Result<(SandboxRecord, Option<(ZygoteKind, String)>), LifecycleError> {
    start_born(state, tenant, spec, metadata, expiry, Birth::Fresh).await
}

/// As [`start_sandbox`], the runtime making the sandbox as `birth` says.
pub(crate) async fn start_born(
    state: &AppState,
    tenant: &Tenant,
    mut spec: SandboxSpec,
    metadata: BTreeMap<String, String>,
    (expires_ms, lifecycle): (i64, Lifecycle),
    birth: Birth<'_>,
) -> Result<(SandboxRecord, Option<(ZygoteKind, String)>), LifecycleError> {
    // Before anything exists: a tier that cannot run here, a bad policy or an unknown secret is the caller's mistake,
    // and secrets add environment variables (which rule out a pool member, whose environment was fixed when it was
    // made).
    let isolation = resolve_isolation(state, tenant, spec.isolation, &spec.workload)?;
    spec.isolation = Some(isolation.tier);
    check_pids(state, spec.limits.pids)?;
    let egress = egress::prepare(state.store(), &tenant.name, &mut spec).await?;
    let claiming = Instant::now();
    let claim = match birth {
        Birth::Fresh => state.pools().claim(&spec, state.runtime(), state.metrics()),
        Birth::Memory(_) => Claim::NoPool,
    };
    let pool_outcome = claim.outcome();
    let claimed = match claim {
        Claim::Hit(claimed) => Some(claimed),
        Claim::Miss { .. } | Claim::NoPool => None,
    };
    let claim_seconds = claiming.elapsed().as_secs_f64();
    let id = match &claimed {
        Some(claimed) => claimed.id.clone(),
        None => ids::sandbox_id()?,
    };
    let zygote = claimed.as_ref().and_then(|claimed| claimed.zygote_kind.zip(claimed.zygote.clone()));
    let record = SandboxRecord {
        id: id.clone(),
        tenant: tenant.name.to_string(),
        state: SandboxState::Running,
        spec,
        isolation,
        metadata,
        created_ms: now_ms(),
        expires_ms,
        ended_ms: None,
        end_reason: None,
        paused_ms: None,
        pause_snapshot: None,
        lifecycle,
    };
    // The row (and the quota it takes) exists before the sandbox is handed out; a failed create removes it again.
    let admitted = state.store().admit_sandbox(record.clone(), tenant.quota).await;
    if !matches!(admitted, Ok(Ok(()))) {
        // Refused (or the store failed): a claimed pool member was never handed out, so it may go back.
        if let Some(claimed) = claimed {
            state.pools().give_back(claimed, state.metrics());
        }
        admitted??;
        return Err(LifecycleError::AdmissionFailed);
    }
    if let Some((class, hit)) = pool_outcome {
        state.pools().settle(class, hit, state.metrics());
    }
    let creating = Instant::now();
    let created = match (claimed, birth) {
        (Some(_), _) => Ok(claim_seconds),
        (None, Birth::Fresh) => {
            state.runtime().create(&id, &record.spec).await.map(|()| creating.elapsed().as_secs_f64())
        }
        (None, Birth::Memory(dir)) => {
            state.runtime().create_from_memory(&id, &record.spec, dir).await.map(|()| creating.elapsed().as_secs_f64())
        }
    };
    if let Ok(seconds) = created {
        // On a pool hit this is the claim (taking a ready sandbox), not the sandbox's creation long before.
        state.metrics().sandbox_create_finished(seconds);
    }
    if let Err(failure) = created {
        tracing::warn!(sandbox = %id, tenant = %tenant.name, kind = ?failure.kind, reason = %failure.message, "create failed");
        state.store().forget_sandbox(&id).await?;
        return Err(failure.into());
    }
    // The runtime says how a microVM actually started (a pool member's was recorded when it was made).
    if let Some(vm) = state.runtime().vm_boot(&id)
        && record.isolation.accel != Some(vm.accel)
    {
        let isolation = Isolation { accel: Some(vm.accel), ..record.isolation.clone() };
        state.store().set_isolation(&id, &isolation).await?;
    }
    // Expiry may have ended the row while the runtime was creating; then the new sandbox must not outlive it.
    let current = state.store().sandbox(&tenant.name, &id).await?;
    let Some(current) = current.filter(|r| r.state == SandboxState::Running) else {
        destroy_quietly(state, &id).await;
        return Err(LifecycleError::EndedWhileCreating(id));
    };
    if let Err(failure) = state.egress().attach(state.runtime(), &id, &tenant.name, egress).await {
        tracing::warn!(sandbox = %id, reason = %failure.message, "egress attach failed");
        destroy_quietly(state, &id).await;
        state.store().forget_sandbox(&id).await?;
        return Err(failure.into());
    }
    state.metrics().sandbox_created();
    tracing::info!(
        sandbox = %id, tenant = %tenant.name, isolation = %current.spec.tier(),
        memory_bytes = current.spec.limits.memory_bytes, "sandbox created"
    );
    Ok((current, zygote))
}

/// Undoes a start that succeeded but whose caller could not finish (a fork or a restore that failed half-way): the
/// sandbox is destroyed and its row removed, as if it had never been created.
pub(crate) async fn abandon(state: &AppState, id: &str) {
    destroy_quietly(state, id).await;
    if let Err(error) = state.store().forget_sandbox(id).await {
        tracing::error!(sandbox = %id, %error, "could not remove the row of an abandoned sandbox");
    }
}
