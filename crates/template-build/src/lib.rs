//! Building templates (issue #16): a [`Plan`] (the spec, its base resolved against the cache, its steps keyed), then
//! [`build`], which runs each step in a build sandbox ([`sandbox`]: a process-tier sandbox over the layers so far
//! whose writes are captured as the next layer and whose only way out is an egress proxy allowing the package
//! registries), checks `ready`, and writes the template. Progress is a stream of [`BuildEvent`]s: the CLI
//! (`sandkasten template build`) renders them, `POST /v1/templates` sends them as server-sent events. [`TemplateStore`]
//! copies built templates to and from an object store, so several hosts share them.

mod base;
mod builder;
mod error;
mod event;
pub mod sandbox;
mod share;

pub use base::ResolvedBase;
pub use builder::{BuildOptions, OUTPUT_LIMIT, Plan, build};
pub use error::BuildError;
pub use event::{BuildEvent, FailedAt, FailedPhase};
pub use share::{PruneFailure, PruneReport, PrunedVersion, ShareError, TemplateStore};

/// Clears what killed builds left in `cache` (partial entries, mounted step captures). The caller holds the cache's
/// lock, so no build is running.
pub fn clean_leftovers(cache: &sandkasten_template::TemplateCache) {
    let _ = cache.remove_partials();
    sandbox::remove_stale_captures(&cache.build_dir());
}
