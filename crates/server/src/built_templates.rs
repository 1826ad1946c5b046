//! A request's `template` (create and `/v1/run`): a root layout built in (`host`, `e2b`) or the name of a template
//! built into the server's template cache (`[templates] cache`, written by `sandkasten template build --cache DIR`).
//! A built template is the `host` layout with its layers read-only at `/opt` and its environment under the request's
//! own (`PATH` with its venv and npm `bin` first, `NODE_PATH`, its `env`); the sandbox's answers name it.

use std::collections::BTreeMap;

use sandkasten_template::{CacheError, TemplateCache};
use sandkasten_types::{SandboxSpec, Template, TemplateLayers};

use crate::config::TemplatesConfig;

/// Why a request's `template` names nothing this server can start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ChooseError {
    /// Neither built in nor built on this server; the message says how to build it.
    #[error("{0}")]
    Unknown(String),
    /// The template cache could not be read, or a layer of the template is missing from it.
    #[error("{0}")]
    Cache(String),
    /// The template is not in this host's cache and a build holds the cache, so it cannot be pulled now.
    #[error("{0}")]
    Busy(String),
    /// Pulling the template from the template store failed.
    #[error("{0}")]
    Store(String),
}

/// What a request's `template` makes of a sandbox.
#[derive(Debug, Default)]
pub(crate) struct Chosen {
    /// The root layout.
    pub layout: Template,
    /// A built template's layers (empty for a built-in layout).
    pub layers: TemplateLayers,
    /// A built template's environment (the request's own goes over it).
    pub env: BTreeMap<String, String>,
    /// The modules a built template names for a warm pool's zygote to import ahead of time.
    pub preload: Vec<String>,
}

impl Chosen {
    /// `spec` with this template: its layout, its layers and its environment under the spec's own.
    pub(crate) fn apply(self, spec: &mut SandboxSpec) {
        let Chosen { layout, layers, env, preload: _ } = self;
        spec.template = layout;
        spec.layers = layers;
        let own = std::mem::take(&mut spec.env);
        spec.env = env;
        spec.env.extend(own);
    }
}

/// Resolves `name` (none: `host`) against the built-in layouts and then the template cache of `config`.
pub(crate) fn choose(config: &TemplatesConfig, name: Option<&str>) -> Result<Chosen, ChooseError> {
    let name = match name {
        None | Some("host") => return Ok(Chosen::default()),
        Some("e2b") => return Ok(Chosen { layout: Template::E2b, ..Chosen::default() }),
        Some(name) => name,
    };
    let root = config.cache_root();
    let unknown = || {
        ChooseError::Unknown(format!(
            "template {name:?} is neither built in (host, e2b) nor built on this server (in {}): build it with \
             `sandkasten template build --cache {} FILE`",
            root.display(),
            root.display()
        ))
    };
    if !root.is_dir() {
        return Err(unknown());
    }
    let cache = TemplateCache::open(&root).map_err(|error| ChooseError::Cache(error.to_string()))?;
    let record = match cache.template(name) {
        Ok(record) => record,
        Err(CacheError::UnknownTemplate(_)) => return Err(unknown()),
        Err(error) => return Err(ChooseError::Cache(error.to_string())),
    };
    if let Some(bad) = record.layers.iter().find(|digest| !sandkasten_template::cache::is_layer_digest(digest)) {
        return Err(ChooseError::Cache(format!("template {name}: {bad:?} is not a layer digest")));
    }
    if let Some(missing) = record.layers.iter().find(|digest| !cache.layer_dir(digest).is_dir()) {
        return Err(ChooseError::Cache(format!("template {name}: layer {missing} is missing from {}", root.display())));
    }
    Ok(Chosen { layout: Template::Host, layers: cache.layers_of(&record), env: record.env, preload: record.preload })
}

/// The name a sandbox's answers give its template: the built template's, or the layout's.
pub(crate) fn name_of(spec: &SandboxSpec) -> String {
    match (&spec.layers.name, spec.template) {
        (Some(name), _) => name.clone(),
        (None, Template::Host) => "host".to_owned(),
        (None, Template::E2b) => "e2b".to_owned(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    /// A layer digest (64 hex digits: `choose` refuses anything else).
    const LAYER: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    use super::*;

    #[test]
    fn built_in_layouts_need_no_cache_and_an_unknown_name_says_how_to_build_it() {
        let config = TemplatesConfig { cache: Some("/nonexistent-cache".into()), ..TemplatesConfig::default() };
        assert_eq!(choose(&config, None).unwrap().layout, Template::Host);
        assert_eq!(choose(&config, Some("e2b")).unwrap().layout, Template::E2b);
        let error = choose(&config, Some("tables")).unwrap_err();
        assert!(
            matches!(&error, ChooseError::Unknown(message) if message.contains("\"tables\"") && message.contains("template build")),
            "{error}"
        );
    }

    #[test]
    fn a_built_template_brings_its_layers_and_environment_under_the_requests() {
        let root = tempfile::tempdir_in("/var/tmp").unwrap();
        let cache = TemplateCache::open(root.path()).unwrap();
        std::fs::create_dir_all(cache.layer_dir(LAYER)).unwrap();
        let record = sandkasten_template::TemplateRecord {
            name: "tables".into(),
            digest: "sha256:00".into(),
            base: "host".into(),
            root: sandkasten_template::Base::Host,
            layers: vec![LAYER.into()],
            env: BTreeMap::from([("PATH".into(), "/opt/v/bin:/usr/bin".into()), ("A".into(), "template".into())]),
            workdir: None,
            user: "sandbox".into(),
            preload: Vec::new(),
            size_bytes: 0,
            created: 0,
        };
        cache.put_template(&record).unwrap();
        let config = TemplatesConfig { cache: Some(root.path().into()), ..TemplatesConfig::default() };
        let mut spec = SandboxSpec { env: BTreeMap::from([("A".into(), "request".into())]), ..SandboxSpec::default() };
        choose(&config, Some("tables")).unwrap().apply(&mut spec);
        assert_eq!(spec.layers.layers, vec![cache.layer_dir(LAYER)]);
        assert_eq!(name_of(&spec), "tables");
        assert_eq!(spec.env["A"], "request", "the request's environment goes over the template's");
        assert_eq!(spec.env["PATH"], "/opt/v/bin:/usr/bin");
        assert_eq!(name_of(&SandboxSpec::default()), "host");
    }
}
