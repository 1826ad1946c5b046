//! What every handler shares: the store, the runtime, the keyring, the limits from the config, the metrics and the
//! warm pools.

use sandkasten_snapshot_store::SnapshotStore;
use std::sync::{Arc, Mutex};

use sandkasten_egress::{AuditEvent, AuditSink, Proxy};
use sandkasten_runtime::SandboxRuntime;
use sandkasten_types::Tier;
use tokio::sync::mpsc;

use crate::auth::Keyring;
use crate::config::{ConfigError, ServerConfig};
use crate::e2b::sessions::Sessions;
use crate::egress::Egress;
use crate::egress::audit::{self, AuditQueue};
use crate::metrics::Metrics;
use crate::output_budgets::OutputBudgets;
use crate::pool::Pools;
use crate::store::Store;
use crate::transfers::Transfers;
use crate::transitions::Transitions;
use crate::usage_samples::UsageSamples;

/// Limits and defaults taken from the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Lifetime of a sandbox created without `timeout_s`, in seconds.
    pub default_timeout_s: u64,
    /// Largest accepted `timeout_s`, in seconds.
    pub max_timeout_s: u64,
    /// Largest file read or written through the files API, in bytes.
    pub max_file_bytes: u64,
    /// Largest JSON request body, in bytes.
    pub max_json_bytes: u64,
    /// Isolation tier of a create that names none (`[defaults] isolation`).
    pub isolation: Tier,
    /// Largest `limits.pids` of one sandbox the config allows (the runtime's own cap applies too).
    pub max_pids: Option<u64>,
    /// `GET /metrics` needs an API key.
    pub metrics_require_auth: bool,
    /// What the database keeps of ended things.
    pub retention: crate::config::RetentionConfig,
}

impl Settings {
    /// The settings of a config.
    pub fn from_config(config: &ServerConfig) -> Settings {
        Settings {
            default_timeout_s: config.default_timeout_s,
            max_timeout_s: config.max_timeout_s,
            max_file_bytes: config.max_file_bytes,
            max_json_bytes: config.max_json_bytes,
            isolation: config.defaults.isolation,
            max_pids: config.max_pids,
            metrics_require_auth: config.metrics.require_auth,
            retention: config.retention,
        }
    }
}

struct Inner {
    store: Store,
    runtime: Arc<dyn SandboxRuntime>,
    keyring: Keyring,
    settings: Settings,
    auto: crate::config::AutoConfig,
    metrics: Metrics,
    pools: Pools,
    egress: Egress,
    audit: Mutex<Option<AuditReceiver>>,
    e2b: Sessions,
    output_budgets: OutputBudgets,
    snapshots: SnapshotStore,
    snapshot_work: std::path::PathBuf,
    usage_samples: UsageSamples,
    transfers: Transfers,
    transitions: Transitions,
    mcp: crate::mcp::sessions::McpSessions,
    mcp_config: crate::config::McpConfig,
    effective_config: ServerConfig,
    /// Cancelled when the server begins to stop: long streams (a template build's) end then, so the graceful
    /// shutdown does not wait for them.
    stopping: tokio_util::sync::CancellationToken,
    shared_templates: crate::shared_templates::SharedTemplates,
    /// Keeps the layers a create chose from a removal until its sandbox's row names them (`template_use`).
    template_use: crate::template_use::TemplateUse,
}

/// The audit queue's two ends, until `serve_on` starts the writer.
type AuditReceiver = (Arc<AuditQueue>, mpsc::Receiver<AuditEvent>);

/// The server's shared state; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("settings", &self.inner.settings).finish_non_exhaustive()
    }
}

impl AppState {
    /// State for a validated `config`, an opened `store` and a `runtime`; an egress setting the proxy refuses or a
    /// pool whose template is not built is a config error.
    pub fn new(
        config: &ServerConfig,
        store: Store,
        snapshots: SnapshotStore,
        runtime: Arc<dyn SandboxRuntime>,
    ) -> Result<AppState, ConfigError> {
        let (queue, receiver) = audit::queue();
        let proxy = Proxy::new(config.egress.clone(), Arc::clone(&queue) as Arc<dyn AuditSink>)
            .map_err(|e| ConfigError::at(format!("egress.{}", e.key()), e))?;
        let pools = Pools::new(&config.pools, config.defaults.isolation, &config.templates)?;
        Ok(AppState {
            inner: Arc::new(Inner {
                store,
                keyring: Keyring::from_config(config),
                settings: Settings::from_config(config),
                auto: config.isolation.auto.clone(),
                metrics: Metrics::new(),
                pools,
                egress: Egress::new(proxy),
                audit: Mutex::new(Some((queue, receiver))),
                e2b: Sessions::default(),
                output_budgets: OutputBudgets::new(config.max_retained_output_bytes),
                snapshots,
                snapshot_work: snapshot_work_dir(&config.database),
                usage_samples: UsageSamples::new(config.metrics.samples_kept),
                transfers: Transfers::default(),
                transitions: Transitions::default(),
                mcp: crate::mcp::sessions::McpSessions::default(),
                mcp_config: config.mcp,
                effective_config: config.effective(runtime.max_pids()),
                stopping: tokio_util::sync::CancellationToken::new(),
                shared_templates: crate::shared_templates::SharedTemplates::default(),
                template_use: Default::default(),
                runtime,
            }),
        })
    }

    /// The open MCP sessions and the sandboxes each created.
    pub(crate) fn mcp_sessions(&self) -> &crate::mcp::sessions::McpSessions {
        &self.inner.mcp
    }

    /// The config as the server applies it (`GET /v1/config`): every default filled in.
    pub(crate) fn effective_config(&self) -> &ServerConfig {
        &self.inner.effective_config
    }

    /// The MCP endpoint's bounds (`[mcp]`).
    pub(crate) fn mcp_config(&self) -> crate::config::McpConfig {
        self.inner.mcp_config
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Where memory snapshots' images are put together and taken apart on this host (`snapshot-work` next to the
    /// database; each snapshot's own 0700 directory inside, removed when done and emptied at every start).
    pub(crate) fn snapshot_work(&self) -> &std::path::Path {
        &self.inner.snapshot_work
    }

    /// The snapshot store (chunks and manifests; the snapshots' rows are in `store`).
    pub fn snapshots(&self) -> &SnapshotStore {
        &self.inner.snapshots
    }

    pub(crate) fn runtime(&self) -> &dyn SandboxRuntime {
        self.inner.runtime.as_ref()
    }

    /// Held by a create naming a built template (`name`; none for a built-in layout) while it chooses it; its
    /// `starting` then keeps the layers chosen from a removal until the sandbox's row names them (`template_use`).
    pub(crate) async fn choosing_template(&self, name: Option<&str>) -> Option<crate::template_use::Choosing> {
        match name {
            None | Some("host" | "e2b") => None,
            Some(_) => Some(self.inner.template_use.choosing().await),
        }
    }

    /// Holds off template removals (the pools' refill while it switches a pool to a rebuilt template's layers).
    pub(crate) async fn holding_templates(&self) -> tokio::sync::OwnedRwLockReadGuard<()> {
        self.inner.template_use.holding().await
    }

    /// Held by a template removal while it decides: no create is choosing a template meanwhile, and the layers of
    /// those that chose before are its `starting_layers`.
    pub(crate) async fn removing_templates(&self) -> crate::template_use::Removing {
        self.inner.template_use.removing().await
    }

    /// Pulls of templates from the template store (`[templates] share`).
    pub(crate) fn shared_templates(&self) -> &crate::shared_templates::SharedTemplates {
        &self.inner.shared_templates
    }

    /// Cancelled when the server begins to stop.
    pub(crate) fn stopping(&self) -> &tokio_util::sync::CancellationToken {
        &self.inner.stopping
    }

    /// The runtime, shared (for work that outlives a borrow: a template build's sandboxes).
    pub(crate) fn shared_runtime(&self) -> Arc<dyn SandboxRuntime> {
        Arc::clone(&self.inner.runtime)
    }

    pub(crate) fn keyring(&self) -> &Keyring {
        &self.inner.keyring
    }

    /// Limits and defaults.
    pub fn settings(&self) -> Settings {
        self.inner.settings
    }

    /// How `isolation: "auto"` chooses (`[isolation.auto]`).
    pub(crate) fn auto_isolation(&self) -> &crate::config::AutoConfig {
        &self.inner.auto
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// What command output the server holds for each sandbox and tenant.
    pub(crate) fn output_budgets(&self) -> &OutputBudgets {
        &self.inner.output_budgets
    }

    /// Egress: the proxy and each sandbox's door into it.
    pub fn egress(&self) -> &Egress {
        &self.inner.egress
    }

    /// The egress audit writer (once; `serve_on` runs it, tests may too).
    pub fn audit_writer(&self) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        let (queue, receiver) = self.inner.audit.lock().ok()?.take()?;
        let state = self.clone();
        Some(async move { audit::run(state.store(), state.metrics(), queue, receiver).await })
    }

    /// The warm pools.
    pub fn pools(&self) -> &Pools {
        &self.inner.pools
    }

    /// Each running sandbox's usage samples.
    pub(crate) fn usage_samples(&self) -> &UsageSamples {
        &self.inner.usage_samples
    }

    /// The snapshot transfers in progress.
    pub(crate) fn transfers(&self) -> &Transfers {
        &self.inner.transfers
    }

    /// The pauses and resumes in progress, one per sandbox.
    pub(crate) fn transitions(&self) -> &Transitions {
        &self.inner.transitions
    }

    /// The E2B facade's sandbox sessions (access tokens).
    pub(crate) fn e2b(&self) -> &Sessions {
        &self.inner.e2b
    }
}

/// `snapshot-work` in the database's directory.
fn snapshot_work_dir(database: &std::path::Path) -> std::path::PathBuf {
    let dir = database.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    dir.join("snapshot-work")
}
