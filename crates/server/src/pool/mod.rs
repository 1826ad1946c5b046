//! Warm pools: per `[[pools]]` entry of the config, sandboxes created ahead of time (through the runtime's ordinary
//! create: namespaces, cgroup, mounts, agent waiting) under server-chosen ids, so that a create is a claim.
//!
//! - A pool's members all run on one isolation tier (its `isolation`, else `[defaults] isolation`), and a claim
//!   only ever takes a member of the tier the request resolved to: a `process` member never serves a `gvisor`
//!   request, nor the other way round.
//! - An idle member belongs to no tenant and has no row in the store; it counts against no quota. A claim gives the
//!   caller the member's id, then the row is admitted against the caller's quota like any create; when the quota
//!   refuses, the untouched member goes back to the pool.
//! - A claimed sandbox never returns to a pool: deleting it destroys it, and the refill task creates a new one.
//! - The refill task (`lifecycle::refill`, over what this module offers it: [`Pools::next_fill`],
//!   [`Pools::fill_finished`], [`Pools::prune`]) keeps each pool at its target of ready members (never more than `max`), one creation at a time,
//!   and drops members whose agent died (they are replaced). The target is `min`, raised by one per recent miss up to
//!   `max` and lowered back one step per `class::GROW_DECAY` (10 s) without a miss (see `class`).
//! - An admin resizes a pool at run time (`PUT /v1/pools/{name}`): a higher `min` is refilled, a lower `max` destroys
//!   the ready members past it. Sizes set this way last until the server restarts (the config file is not written).
//! - A pool whose template is rebuilt (built again into the template cache: other layers, environment or preload)
//!   makes its members of the new one: the refill task resolves the pools' templates every 2 s, destroys the ready
//!   members of the old one and keeps no creation started before ([`Pools::follow_templates`]). A template removed
//!   meanwhile leaves its pool as it was (its layers stay: `template_layers`).
//! - Members are runtime sandboxes like any other: when the server goes, the runtime destroys them with the rest.
//! - A pool with a zygote (`zygote = "python"` or `"node"`) starts it in each new member as a background command
//!   (`python3 -c <resources/zygotes/python_zygote.py> <preload...>`, `node -e <resources/zygotes/node_zygote.js>
//!   <preload...>`); the member is ready only once it runs. The zygote loads the preload modules and waits for one
//!   program on its stdin (Python: the source, run in a forked child; Node: the path of the main file, run in the
//!   zygote process itself), for `POST /v1/run` (see `api::run::task`). A claim that does not use the zygote (a plain
//!   create) kills it.
//! - Such a member also gets a spare code-context kernel of the zygote's language with the same preload modules
//!   (`SandboxRuntime::prepare_context`, runtime-internal: not a background command of the API); the sandbox's first
//!   code context of that language adopts it instead of starting cold. A `POST /v1/run` claim discards it. A member
//!   whose spare fails to start is still ready (its contexts start cold).

mod class;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sandkasten_types::{CodeLanguage, SandboxSpec, Tier};
use tokio::sync::Notify;

use crate::config::{ConfigError, PoolConfig, TemplatesConfig, ZygoteKind};
use crate::metrics::Metrics;
use class::PoolClass;
pub(crate) use class::{Member, PoolStatus};
use sandkasten_runtime::SandboxRuntime;

/// The Python zygote's program (`python3 -c`).
const PYTHON_ZYGOTE: &str = include_str!("../../../../resources/zygotes/python_zygote.py");
/// The Node.js zygote's program (`node -e`).
const NODE_ZYGOTE: &str = include_str!("../../../../resources/zygotes/node_zygote.js");
/// The argv of a pool's zygote.
fn zygote_argv(kind: ZygoteKind, preload: &[String]) -> Vec<String> {
    let head = match kind {
        ZygoteKind::Python => ["python3", "-c", PYTHON_ZYGOTE],
        ZygoteKind::Node => ["node", "-e", NODE_ZYGOTE],
    };
    head.into_iter().map(str::to_owned).chain(preload.iter().cloned()).collect()
}

/// A sandbox taken from a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Claimed {
    /// Which pool.
    pub(crate) class: usize,
    /// The sandbox's id (from now on the caller's).
    pub(crate) id: String,
    /// The command id of the member's zygote, when its pool has one.
    pub(crate) zygote: Option<String>,
    /// Which interpreter that zygote is.
    pub(crate) zygote_kind: Option<ZygoteKind>,
}

/// Updates a pool's gauges.
fn report(metrics: &Metrics, pool: &PoolClass) {
    metrics.pool_size(&pool.name, pool.ready());
    metrics.pool_target(&pool.name, pool.target());
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claim {
    /// No pool serves the spec.
    NoPool,
    /// Pool `class` serves the spec but has nothing ready.
    Miss {
        /// The pool's index.
        class: usize,
    },
    /// A ready sandbox, now the caller's.
    Hit(Claimed),
}

impl Claim {
    /// The pool and whether it was a hit, for [`Pools::settle`]; `None` when no pool serves the spec.
    pub(crate) fn outcome(&self) -> Option<(usize, bool)> {
        match self {
            Claim::NoPool => None,
            Claim::Miss { class } => Some((*class, false)),
            Claim::Hit(claimed) => Some((claimed.class, true)),
        }
    }
}

/// The server's warm pools.
#[derive(Debug, Default)]
pub struct Pools {
    classes: Mutex<Vec<PoolClass>>,
    /// The pools' config entries and the default tier, in `classes`' order: what a rebuilt template is applied to.
    configs: Vec<PoolConfig>,
    default_tier: Option<Tier>,
    wake: Notify,
}

/// What a pool's members are made of: its spec, its zygote's argv and the modules the zygote and spare kernel
/// preload.
type Recipe = (SandboxSpec, Option<Vec<String>>, Vec<String>);

/// The recipe of the pool `config` (its template resolved against `templates` now).
fn recipe(
    config: &PoolConfig,
    default_tier: Tier,
    templates: &TemplatesConfig,
) -> Result<Recipe, crate::built_templates::ChooseError> {
    let chosen = crate::built_templates::choose(templates, Some(&config.template))?;
    let mut preload = config.preload.clone();
    if config.zygote.is_some() {
        preload.extend(chosen.preload.iter().filter(|module| !config.preload.contains(module)).cloned());
        // The template's list comes from the operator's cache, each name checked; the merge is bounded too.
        preload.truncate(crate::config::MAX_PRELOAD);
    }
    let mut spec = SandboxSpec {
        isolation: Some(config.tier(default_tier)),
        limits: config.limits.clone(),
        ..SandboxSpec::default()
    };
    chosen.apply(&mut spec);
    let zygote = config.zygote.map(|kind| zygote_argv(kind, &preload));
    Ok((spec, zygote, preload))
}

impl Pools {
    /// Empty pools as configured (the refill task fills them); a pool without its own `isolation` gets
    /// `default_tier` (`[defaults] isolation`). A pool's template is resolved now against `templates`: one that is
    /// not built is a config error naming the pool.
    pub fn new(configs: &[PoolConfig], default_tier: Tier, templates: &TemplatesConfig) -> Result<Pools, ConfigError> {
        let mut classes = Vec::with_capacity(configs.len());
        for (index, config) in configs.iter().enumerate() {
            let (spec, zygote, preload) = recipe(config, default_tier, templates)
                .map_err(|error| ConfigError::at(format!("pools[{index}].template"), error))?;
            let mut class = PoolClass::new(config.name_at(index), spec, config.min, config.max);
            class.zygote = zygote;
            class.zygote_kind = config.zygote;
            class.preload = preload;
            classes.push(class);
        }
        Ok(Pools {
            classes: Mutex::new(classes),
            configs: configs.to_vec(),
            default_tier: Some(default_tier),
            wake: Notify::new(),
        })
    }

    /// The name of the first pool whose config names the template `name`.
    pub(crate) fn pool_of_template(&self, name: &str) -> Option<String> {
        let index = self.configs.iter().position(|config| config.template == name)?;
        Some(self.configs[index].name_at(index))
    }

    /// Whether a pool names a template built into the cache (which a rebuild may change).
    pub(crate) fn follows_templates(&self) -> bool {
        self.configs.iter().any(|config| !matches!(config.template.as_str(), "host" | "e2b"))
    }

    /// Resolves every pool's template again (blocking: reads the template cache); a pool whose template was rebuilt
    /// (other layers, environment or preload) makes its members of the new one from now on. Returns the ready
    /// members of the old ones, removed from their pools, for the caller to destroy. A template that no longer
    /// resolves (removed, or the cache unreadable) leaves its pool as it is.
    pub(crate) fn follow_templates(&self, templates: &TemplatesConfig, metrics: &Metrics) -> Vec<String> {
        let Some(default_tier) = self.default_tier else { return Vec::new() };
        let recipes: Vec<Option<Recipe>> =
            self.configs.iter().map(|config| recipe(config, default_tier, templates).ok()).collect();
        let Ok(mut classes) = self.classes.lock() else { return Vec::new() };
        let mut stale = Vec::new();
        for (pool, recipe) in classes.iter_mut().zip(recipes) {
            let Some((spec, zygote, preload)) = recipe else { continue };
            if spec == pool.spec && preload == pool.preload {
                continue;
            }
            tracing::info!(pool = %pool.name, template = ?spec.layers.name, "pool template rebuilt: replacing its members");
            stale.extend(pool.replace_spec(spec, zygote, preload));
            report(metrics, pool);
        }
        drop(classes);
        if !stale.is_empty() {
            self.wake.notify_one();
        }
        stale
    }

    /// The template layers the pools' members are made of (members yet to be made need them too).
    pub(crate) fn template_layers(&self) -> Vec<std::path::PathBuf> {
        let classes = self.classes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        classes.iter().flat_map(|class| class.spec.layers.layers.iter().cloned()).collect()
    }

    /// Whether any pool is configured.
    pub fn is_empty(&self) -> bool {
        self.classes.lock().map(|c| c.is_empty()).unwrap_or(true)
    }

    /// Every pool's name, spec and numbers, in config order.
    pub(crate) fn status(&self) -> Vec<PoolStatus> {
        let Ok(classes) = self.classes.lock() else { return Vec::new() };
        classes.iter().map(PoolClass::status).collect()
    }

    /// Sets the sizes of pool `name` (validated by the caller: `min <= max`); `None` when there is no such pool.
    /// Returns the pool's new status and the ready members past the new `max`, removed from the pool, for the caller
    /// to destroy. The refill task is woken to fill up to a higher `min`.
    pub(crate) fn resize(
        &self,
        name: &str,
        min: usize,
        max: usize,
        metrics: &Metrics,
    ) -> Option<(PoolStatus, Vec<String>)> {
        let mut classes = self.classes.lock().ok()?;
        let pool = classes.iter_mut().find(|p| p.name == name)?;
        let surplus = pool.resize(min, max);
        report(metrics, pool);
        let status = pool.status();
        drop(classes);
        self.wake.notify_one();
        Some((status, surplus))
    }

    /// Takes a live ready sandbox for `spec` (its tier resolved), if a pool serves it and has one. Nothing is counted yet: the caller
    /// [`settle`](Pools::settle)s the claim once the sandbox is admitted, or gives a member back when refused, so
    /// that refused requests neither count as hits or misses nor make a pool grow.
    pub(crate) fn claim(&self, spec: &SandboxSpec, runtime: &dyn SandboxRuntime, metrics: &Metrics) -> Claim {
        let Ok(mut classes) = self.classes.lock() else { return Claim::NoPool };
        let Some(class) = classes.iter().position(|p| p.serves(spec)) else { return Claim::NoPool };
        let pool = &mut classes[class];
        let claimed = loop {
            match pool.take() {
                // Its agent died since the last check: the runtime has removed it already.
                Some(member) if !runtime.is_alive(&member.id) => continue,
                Some(Member { id, zygote }) => {
                    break Some(Claimed { class, id, zygote, zygote_kind: pool.zygote_kind });
                }
                None => break None,
            }
        };
        report(metrics, pool);
        match claimed {
            Some(claimed) => Claim::Hit(claimed),
            None => Claim::Miss { class },
        }
    }

    /// Counts an admitted claim of pool `class` (a hit, or a miss that raises the pool's target) and wakes the
    /// refill.
    pub(crate) fn settle(&self, class: usize, hit: bool, metrics: &Metrics) {
        if let Ok(mut classes) = self.classes.lock()
            && let Some(pool) = classes.get_mut(class)
        {
            pool.count_claim(hit, Instant::now());
            report(metrics, pool);
        }
        self.wake.notify_one();
        if hit {
            metrics.pool_hit();
        } else {
            metrics.pool_miss();
        }
    }

    /// Returns a claimed sandbox nobody used (its caller was refused before the sandbox was handed out).
    pub(crate) fn give_back(&self, claimed: Claimed, metrics: &Metrics) {
        if let Ok(mut classes) = self.classes.lock()
            && let Some(pool) = classes.get_mut(claimed.class)
        {
            pool.give_back(Member { id: claimed.id, zygote: claimed.zygote });
            report(metrics, pool);
        }
    }

    /// Sets every pool's gauges (the refill task does, when it starts).
    pub(crate) fn report_all(&self, metrics: &Metrics) {
        if let Ok(classes) = self.classes.lock() {
            classes.iter().for_each(|pool| report(metrics, pool));
        }
    }

    /// Waits until a claim, a resize or a finished creation may have changed what the pools want, or `at_most`.
    pub(crate) async fn wait_for_change(&self, at_most: Duration) {
        tokio::select! {
            () = self.wake.notified() => {}
            () = tokio::time::sleep(at_most) => {}
        }
    }

    /// Marks one creation as started for the first pool that wants one; what to create.
    pub(crate) fn next_fill(&self) -> Option<Fill> {
        let mut classes = self.classes.lock().ok()?;
        let (class, pool) = classes.iter_mut().enumerate().find(|(_, p)| p.wants_more())?;
        pool.fill_started();
        Some(Fill {
            class,
            generation: pool.generation,
            spec: pool.spec.clone(),
            zygote: pool.zygote.clone(),
            spare: pool.zygote_kind.map(|kind| (kind.language(), pool.preload.clone())),
        })
    }

    /// Ends a creation `fill` started; returns an id to destroy when the pool turned out full or its spec was
    /// replaced meanwhile.
    pub(crate) fn fill_finished(&self, fill: &Fill, member: Option<Member>, metrics: &Metrics) -> Option<String> {
        let mut classes = self.classes.lock().ok()?;
        let pool = classes.get_mut(fill.class)?;
        let surplus = pool.fill_finished(member, fill.generation);
        report(metrics, pool);
        surplus
    }

    /// Drops dead members everywhere and lets raised targets decay.
    pub(crate) fn prune(&self, runtime: &dyn SandboxRuntime, metrics: &Metrics) {
        if let Ok(mut classes) = self.classes.lock() {
            let now = Instant::now();
            for pool in classes.iter_mut() {
                let dead = pool.prune(|id| runtime.is_alive(id));
                if !dead.is_empty() {
                    tracing::warn!(pool = %pool.name, sandboxes = ?dead, "pool members died; replacing them");
                }
                let target = pool.target();
                pool.decay(now);
                if !dead.is_empty() || pool.target() != target {
                    report(metrics, pool);
                }
            }
        }
    }

    /// Removes every ready member from the pools; returns their ids (to destroy at shutdown).
    pub(crate) fn drain(&self) -> Vec<String> {
        self.classes.lock().map(|mut c| c.iter_mut().flat_map(PoolClass::drain).collect()).unwrap_or_default()
    }
}

/// One member to create.
#[derive(Clone)]
pub(crate) struct Fill {
    /// Which pool.
    pub(crate) class: usize,
    /// The pool's spec generation (see `PoolClass::generation`).
    pub(crate) generation: u64,
    /// The pool's spec.
    pub(crate) spec: SandboxSpec,
    /// The zygote's argv, when the pool has one.
    pub(crate) zygote: Option<Vec<String>>,
    /// The spare kernel's language and preload modules, when the pool has a zygote.
    pub(crate) spare: Option<(CodeLanguage, Vec<String>)>,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_of_a_template_that_is_not_built_is_a_config_error_naming_the_pool() {
        let templates = TemplatesConfig { cache: Some("/nonexistent-cache".into()), ..TemplatesConfig::default() };
        let pool = |template: &str| PoolConfig { template: template.to_owned(), ..toml::from_str("").unwrap() };
        assert!(Pools::new(&[pool("host"), pool("e2b")], Tier::Process, &templates).is_ok());
        let error = Pools::new(&[pool("host"), pool("nonesuch")], Tier::Process, &templates).unwrap_err();
        let problem = &error.problems()[0];
        assert_eq!(problem.path, "pools[1].template", "{error}");
        assert!(problem.message.contains("template build"), "{error}");
    }
}
