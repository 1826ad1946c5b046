//! `sandkasten serve`: long-lived sandboxes over HTTP. Tenants authenticate with API keys, sandboxes live in SQLite
//! and in a `sandkasten_runtime::SandboxRuntime` (the live runtime, or a fake in tests; held as
//! `Arc<dyn SandboxRuntime>`), and the API is described by OpenAPI.
//!
//! - [`serve`] (or [`serve_on`] with a bound listener) runs the server until a shutdown signal;
//! - [`router`] builds the API over an [`AppState`] (tests drive it with `tower::ServiceExt::oneshot`).

pub mod api;
pub mod auth;
mod built_templates;
pub mod clock;
pub mod config;
mod e2b;
pub mod egress;
mod http_connections;
mod http_serve;
pub mod ids;
pub mod lifecycle;
mod listing;
mod mcp;
mod metrics;
mod migrations;
mod output_budgets;
pub mod pool;
mod port_forward;
pub mod retention;
mod sandbox_lifecycle;
pub mod seal;
pub mod secret_rules;
pub(crate) mod shared_templates;
pub mod state;
pub mod store;
mod store_paused;
mod store_snapshots;
mod supervised;
mod template_use;
pub mod transfers;
mod transitions;
mod usage_sampler;
mod usage_samples;
pub mod validate;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sandkasten_runtime::SandboxRuntime;
use sandkasten_snapshot_store::SnapshotStore;

pub use api::{ApiDoc, openapi_json, router};
pub use config::{AutoConfig, ConfigError, PoolConfig, Problem, Problems, ServerConfig, Trust};
pub use lifecycle::auto_isolation::{HostTiers, choose as choose_auto_isolation};
pub use metrics::{ExecPhase, ExitReason, Metrics};
pub use state::AppState;
pub use store::{Store, StoreError};

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The secrets keys could not be read (or the default key file created).
    #[error(transparent)]
    SecretsKey(#[from] seal::key_source::KeyError),
    /// The database could not be opened, migrated or read.
    #[error("database {path}: {source}")]
    Store {
        /// The database file.
        path: std::path::PathBuf,
        /// Why.
        source: StoreError,
    },
    /// The startup reconcile failed.
    #[error("startup reconcile: {0}")]
    Reconcile(StoreError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("server: {0}")]
    Serve(std::io::Error),
}

/// Runs the server: binds `config.listen`, then as [`serve_on`].
pub async fn serve(
    config: ServerConfig,
    runtime: Arc<dyn SandboxRuntime>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    config.validate()?;
    let addr = config.listen_addr()?;
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| ServerError::Bind { addr, source })?;
    serve_on(listener, config, runtime, shutdown).await
}

/// Refuses a config whose tiers (`[defaults] isolation`, each pool's) this host's runtime cannot run, saying what to
/// install, or a pool whose sandboxes would ask for more pids than one sandbox may have here: otherwise every create
/// naming no tier, or every refill of such a pool, would fail.
fn check_tiers(config: &ServerConfig, runtime: &dyn SandboxRuntime) -> Result<(), ConfigError> {
    let default = config.defaults.isolation;
    let mut problems = Vec::new();
    if let Some(reason) = runtime.tier_unavailable(default) {
        problems.push(Problem::new("defaults.isolation", format!("\"{default}\": {reason}")));
    }
    let cap = lifecycle::pids_cap(config.max_pids, runtime);
    for (index, pool) in config.pools.iter().enumerate() {
        let tier = pool.tier(default);
        if let Some(reason) = runtime.tier_unavailable(tier)
            && pool.isolation.is_some()
        {
            problems.push(Problem::new(format!("pools[{index}].isolation"), format!("\"{tier}\": {reason}")));
        }
        if pool.limits.pids > cap {
            let problem = format!("{} is more than one sandbox may have here ({cap})", pool.limits.pids);
            problems.push(Problem::new(format!("pools[{index}].limits.pids"), problem));
        }
    }
    match problems.is_empty() {
        true => Ok(()),
        false => Err(ConfigError::Invalid(Problems::new(problems))),
    }
}

/// Descriptors the server needs besides its connections and sandboxes (database, spawner, MCP sessions, snapshot
/// transfers, logs).
const OTHER_DESCRIPTORS: u64 = 4096;

/// Descriptors the server holds per running sandbox, at most: its agent's channel and the spawner's handle of it, and
/// the egress door's listener (2 measured for a sandbox without a network policy, 3 with one, on the process and
/// gVisor tiers), and a microVM's door streams (one each, also while the proxy has not taken them yet: the guest's
/// waiting connections are the host's, where elsewhere they wait in the sandbox's own listen backlog).
const DESCRIPTORS_PER_SANDBOX: u64 = 4 + sandkasten_runtime::MAX_HOST_DOOR_STREAMS as u64;

/// The sandboxes this server may run at once: every tenant's `max_sandboxes` (the unauthenticated tenant's too when
/// authentication is off) and every warm pool's `max` (idle members belong to no tenant).
fn most_sandboxes(config: &ServerConfig) -> u64 {
    let tenants = config.tenants.iter().map(|t| t.max_sandboxes).fold(0u64, u64::saturating_add);
    let configured = config.tenants.iter().any(|t| t.name == auth::UNAUTHENTICATED_TENANT);
    let anonymous = if config.insecure_no_auth && !configured {
        config::TenantConfig::new(auth::UNAUTHENTICATED_TENANT).max_sandboxes
    } else {
        0
    };
    let pools = config.pools.iter().map(|p| p.max as u64).fold(0u64, u64::saturating_add);
    tenants.saturating_add(anonymous).saturating_add(pools)
}

/// Raises this process's `RLIMIT_NOFILE` soft limit to its hard limit, and refuses to start when that is still too
/// few for the API's `max_connections`, the egress proxy's connections (`max_total_connections`, two descriptors
/// each: the sandbox's and the upstream's), the sandboxes the tenants and pools may run (`DESCRIPTORS_PER_SANDBOX`
/// each) and everything else (so running out is a configuration error at start, not a silent failure under load).
fn reserve_descriptors(max_connections: usize, egress_connections: usize, sandboxes: u64) -> Result<(), ConfigError> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    let hard = limit.maximum.unwrap_or(u64::MAX);
    if limit.current.is_some_and(|soft| soft < hard) {
        limit.current = Some(hard);
        if let Err(error) = setrlimit(Resource::Nofile, limit) {
            tracing::warn!(%error, "could not raise RLIMIT_NOFILE to its hard limit");
        }
    }
    let soft = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    let egress = 2 * egress_connections as u64;
    let needed = (max_connections as u64)
        .saturating_add(egress)
        .saturating_add(sandboxes.saturating_mul(DESCRIPTORS_PER_SANDBOX))
        .saturating_add(OTHER_DESCRIPTORS);
    if soft < needed {
        return Err(ConfigError::at(
            "http.max_connections",
            format!(
                "{max_connections}, with egress.max_total_connections = {egress_connections} and {sandboxes} \
                 sandboxes at once (the tenants' max_sandboxes and the pools' max), needs {needed} file descriptors, \
                 but RLIMIT_NOFILE allows {soft}: lower them or raise the limit (ulimit -n, LimitNOFILE= in systemd)"
            ),
        ));
    }
    Ok(())
}

/// Runs the server on a bound listener: checks that the configured tiers run here, reads the secrets keys, opens the
/// store (sealing or re-sealing secret values), reconciles it with the runtime, starts the expiry sweeper and the warm
/// pools' refill task, and serves until `shutdown` completes. Shutdown stops accepting connections, ends the MCP sessions and waits for the requests in flight; it
/// destroys no sandbox (they belong to the runtime, and the next start reconciles) but those MCP sessions created
/// without `persist`.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    config: ServerConfig,
    runtime: Arc<dyn SandboxRuntime>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    config.validate()?;
    check_tiers(&config, runtime.as_ref())?;
    reserve_descriptors(config.http.max_connections, config.egress.max_total_connections, most_sandboxes(&config))?;
    let keys = seal::key_source::load(&config.secrets, &config.database)?;
    let store = Store::open(&config.database, keys)
        .map_err(|source| ServerError::Store { path: config.database.clone(), source })?;
    let snapshots = SnapshotStore::open(&config.snapshots.store_config(&config.database))
        .map_err(|e| ServerError::Config(ConfigError::at("snapshots.store", e)))?;
    let state = AppState::new(&config, store, snapshots, runtime)?;
    lifecycle::reconcile::register_tenants(&state).await.map_err(ServerError::Reconcile)?;
    let lost = lifecycle::reconcile::reconcile(&state).await.map_err(ServerError::Reconcile)?;
    let unfinished = lifecycle::reconcile_snapshots(&state).await.map_err(ServerError::Reconcile)?;
    clean_template_builds(&config.templates.cache_root()).await;
    let addr = listener.local_addr().map_err(ServerError::Serve)?;
    if config.insecure_no_auth {
        tracing::warn!(%addr, "authentication is off (insecure_no_auth): every request acts as tenant 'default'");
    }
    tracing::info!(%addr, tenants = config.tenants.len(), lost, unfinished, "sandkasten server listening");
    let (sweeper_state, refill_state, sampler_state) = (state.clone(), state.clone(), state.clone());
    let sweeper =
        tokio::spawn(supervised::supervise("expiry sweeper", move || lifecycle::expiry::run(sweeper_state.clone())));
    let refill =
        tokio::spawn(supervised::supervise("pool refill", move || lifecycle::refill::run(refill_state.clone())));
    let sample_every = Duration::from_secs(config.metrics.sample_interval_s);
    let sampler = tokio::spawn(supervised::supervise("usage sampler", move || {
        usage_sampler::run(sampler_state.clone(), sample_every)
    }));
    let audit = state.audit_writer().map(tokio::spawn);
    // At the signal: kill what MCP sessions created (first, so no session's own close races the process's end),
    // then end the sessions, whose open streams would otherwise hold the graceful shutdown.
    let mcp_state = state.clone();
    let shutdown = async move {
        shutdown.await;
        mcp_state.stopping().cancel();
        mcp::close_sessions(&mcp_state).await;
        mcp_state.mcp_sessions().stopping().cancel();
    };
    let result = http_serve::serve(listener, router(state.clone()), config.http, shutdown).await;
    // Wait for each background task to be gone, not only told to go, so none is mid-write when the store closes.
    for task in [Some(sweeper), Some(refill), Some(sampler), audit].into_iter().flatten() {
        task.abort();
        let _cancelled = task.await;
    }
    // Idle pool members belong to nobody: destroy them now (a creation cut short by the abort is left to the
    // runtime, which destroys every sandbox when it goes).
    lifecycle::refill::destroy_idle(&state).await;
    // Sessions opened after the signal, and requests in flight then, may have created more.
    mcp::close_sessions(&state).await;
    // Tasks a request started may still hold the store: close it now so the database is whole when this returns.
    if let Err(error) = state.store().close().await {
        tracing::warn!(%error, "closing the database failed");
    }
    tracing::info!("sandkasten server stopped");
    result.map_err(ServerError::Serve)
}

/// Clears what a build killed with the server left in the template cache (its step's mounted capture, partial
/// entries), unless a build of the CLI holds the cache now (it clears them itself when it starts).
async fn clean_template_builds(root: &std::path::Path) {
    if !root.is_dir() {
        return;
    }
    let root = root.to_path_buf();
    let _ = tokio::task::spawn_blocking(move || {
        let Ok(cache) = sandkasten_template::TemplateCache::open(&root) else { return };
        if let Ok(Some(_lock)) = cache.try_lock() {
            sandkasten_template_build::clean_leftovers(&cache);
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sandboxes_reserved_for_are_every_tenants_and_the_anonymous_ones_when_authentication_is_off() {
        let tenant =
            |name: &str, max: u64| config::TenantConfig { max_sandboxes: max, ..config::TenantConfig::new(name) };
        let config = ServerConfig { tenants: vec![tenant("a", 64), tenant("b", 8)], ..ServerConfig::default() };
        assert_eq!(most_sandboxes(&config), 72);
        let open = ServerConfig { insecure_no_auth: true, ..config.clone() };
        assert_eq!(most_sandboxes(&open), 72 + config::TenantConfig::new("x").max_sandboxes);
        let named =
            ServerConfig { insecure_no_auth: true, tenants: vec![tenant(auth::UNAUTHENTICATED_TENANT, 5)], ..config };
        assert_eq!(most_sandboxes(&named), 5, "a configured default tenant is counted once");
        let huge = ServerConfig { tenants: vec![tenant("a", u64::MAX), tenant("b", 1)], ..ServerConfig::default() };
        assert_eq!(most_sandboxes(&huge), u64::MAX, "saturates");
    }
}
