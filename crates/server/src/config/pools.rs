//! `[[pools]]`: warm pools, sandboxes of one tier, template and limits class created ahead of time (optionally with
//! an interpreter, the zygote, waiting in each), and their checks.

use sandkasten_types::{Limits, Tier};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::problem::Found;
use crate::config::tenants::{NAME_RULE, valid_name};

/// Largest `max` of a pool.
pub const MAX_POOL_SIZE: usize = 1024;

/// One warm pool: sandboxes of one template and limits class, created ahead of time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Name (the `class` label of `sandkasten_pool_size`). Default `pool-N` (N = position in the file, from 1).
    #[serde(default)]
    pub name: Option<String>,
    /// Isolation tier of the pool's sandboxes. Default `[defaults] isolation`.
    #[serde(default)]
    pub isolation: Option<Tier>,
    /// Template of the pool's sandboxes: `host`, `e2b` or a template built into `[templates] cache` (resolved when
    /// the server starts: a rebuilt template reaches the pool at the next start). A `zygote` also imports the
    /// template's own `preload`. Default `host`.
    #[serde(default = "default_pool_template")]
    pub template: String,
    /// Limits of the pool's sandboxes; omitted fields take their defaults.
    #[serde(default)]
    pub limits: Limits,
    /// Ready sandboxes kept. Default 2.
    #[serde(default = "default_pool_min")]
    pub min: usize,
    /// Most sandboxes the pool holds, ready or being created. Default 8.
    #[serde(default = "default_pool_max")]
    pub max: usize,
    /// An interpreter started in each member once it is created; one-shot runs of its language fork from it. Each
    /// member also holds a spare code-context kernel of that language (with the same preload), which the sandbox's
    /// first code context of the language adopts.
    #[serde(default)]
    pub zygote: Option<ZygoteKind>,
    /// Modules the zygote and the spare kernel import (Python) or require (Node) before they wait: dotted names of identifiers, so Node
    /// preloads builtins and installed packages by plain name (`fs`, `lodash`). Needs `zygote`.
    #[serde(default)]
    pub preload: Vec<String>,
}

/// The interpreter of a pool's zygote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ZygoteKind {
    /// `python3`, serving `POST /v1/run` with `language = "python"`.
    Python,
    /// `node`, serving `POST /v1/run` with `language = "node"`.
    Node,
}

impl ZygoteKind {
    /// The code-context language of the same interpreter.
    pub fn language(self) -> sandkasten_types::CodeLanguage {
        match self {
            ZygoteKind::Python => sandkasten_types::CodeLanguage::Python,
            ZygoteKind::Node => sandkasten_types::CodeLanguage::Javascript,
        }
    }
}

/// A pool's template when the config names none.
fn default_pool_template() -> String {
    "host".to_owned()
}

/// Most modules a zygote may preload.
pub const MAX_PRELOAD: usize = 64;

/// Whether `name` is a dotted module name: identifiers (ASCII letters, digits, `_`, not starting with a digit)
/// joined by single dots, at most 255 bytes.
pub fn valid_module_name(name: &str) -> bool {
    sandkasten_template::spec::is_module_name(name)
}

fn default_pool_min() -> usize {
    2
}
fn default_pool_max() -> usize {
    8
}

impl PoolConfig {
    /// The pool's name: its own, or `pool-N` for the `index`-th pool (from 0).
    pub fn name_at(&self, index: usize) -> String {
        self.name.clone().unwrap_or_else(|| format!("pool-{}", index + 1))
    }

    /// The pool's isolation tier: its own, or `default` (the server's `[defaults] isolation`).
    pub fn tier(&self, default: Tier) -> Tier {
        self.isolation.unwrap_or(default)
    }
}

/// Checks every pool (`default` is `[defaults] isolation`): names, tiers, limits, sizes, zygote preloads, and that no
/// two pools serve the same class.
pub(crate) fn check(pools: &[PoolConfig], default: Tier, found: &mut Found) {
    let mut names = std::collections::BTreeMap::new();
    for (index, pool) in pools.iter().enumerate() {
        let at = format!("pools[{index}]");
        let name = pool.name_at(index);
        if !valid_name(&name) {
            found.add(format!("{at}.name"), format!("pool name {name:?} {NAME_RULE}"));
        }
        if let Some(first) = names.insert(name.clone(), index) {
            found.add(format!("{at}.name"), format!("pool {name:?} is configured twice (also pools[{first}])"));
        }
        let tier = pool.tier(default);
        if let Some(reason) = tier.unavailable_reason()
            && pool.isolation.is_some()
        {
            found.add(format!("{at}.isolation"), reason);
        }
        if let Err(error) = pool.limits.validate() {
            found.add(format!("{at}.limits"), error);
        }
        if pool.min == 0 || pool.min > pool.max {
            found.add(format!("{at}.min"), format!("must be 1 to max ({}), got {}", pool.max, pool.min));
        }
        if pool.max > MAX_POOL_SIZE {
            found.add(format!("{at}.max"), format!("must be at most {MAX_POOL_SIZE}, got {}", pool.max));
        }
        if let Err(rule) = sandkasten_template::spec::check_name(&pool.template) {
            found.add(format!("{at}.template"), format!("template name {:?}: {rule}", pool.template));
        }
        if pool.zygote.is_none() && !pool.preload.is_empty() {
            found.add(format!("{at}.preload"), "preload needs a zygote (zygote = \"python\" or \"node\")");
        }
        if pool.preload.len() > MAX_PRELOAD {
            found.add(format!("{at}.preload"), format!("at most {MAX_PRELOAD} modules, got {}", pool.preload.len()));
        }
        for (number, module) in pool.preload.iter().enumerate() {
            if !valid_module_name(module) {
                found.add(format!("{at}.preload[{number}]"), format!("{module:?} is not a dotted module name"));
            }
        }
        let same = |other: &PoolConfig| {
            other.tier(default) == tier && other.template == pool.template && other.limits == pool.limits
        };
        if let Some(first) = pools[..index].iter().position(same) {
            found.add(
                at,
                format!(
                    "pools[{first}] has the same isolation, template and limits: a create could not tell them apart"
                ),
            );
        }
    }
}
