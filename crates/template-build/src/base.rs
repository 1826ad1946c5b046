//! What a template starts from, resolved against the cache: `host` (nothing below its layers), or a built template
//! whose layers lie below the new ones and whose environment, workdir, user and preload the new template inherits
//! (its own settings win; `PATH` keeps both templates' tools). Debian bases are valid specs but not built yet.

use std::collections::BTreeMap;

use sandkasten_template::spec::{DEFAULT_USER, NPM_PREFIX, VENV_DIR};
use sandkasten_template::{Base, CacheError, SpecError, TemplateCache, TemplateRecord, TemplateSpec, steps};

/// A spec's base, resolved.
#[derive(Debug, Clone)]
pub struct ResolvedBase {
    /// What the template's layers end on (`host`).
    pub root: Base,
    /// The template extended, if the base is one.
    pub template: Option<TemplateRecord>,
}

impl ResolvedBase {
    /// Resolves `spec`'s base: a template base must be built (its record is read now, so a rebuild of it during this
    /// build does not change what this one extends).
    pub fn resolve(cache: &TemplateCache, spec: &TemplateSpec) -> Result<ResolvedBase, SpecError> {
        match &spec.base {
            Base::Host => Ok(ResolvedBase { root: Base::Host, template: None }),
            Base::Debian(suite) => Err(SpecError::at(
                "base",
                format!(
                    "\"debian:{}\" is valid but cannot be built yet (debootstrap bases are not implemented): use \
                     base = \"host\", or a template built on it",
                    suite.name()
                ),
            )),
            Base::Template(name) => match cache.template(name) {
                Ok(record) => {
                    spec.check_on_root(&record.root)?;
                    Ok(ResolvedBase { root: record.root.clone(), template: Some(record) })
                }
                Err(CacheError::UnknownTemplate(_)) => Err(SpecError::at(
                    "base",
                    format!(
                        "no template named {name:?} is built: build it first (`sandkasten template list` shows what is)"
                    ),
                )),
                Err(error) => Err(SpecError::at("base", format!("reading template {name:?}: {error}"))),
            },
        }
    }

    /// The cache key below the first step.
    pub fn key(&self, spec: &TemplateSpec) -> String {
        steps::base_key(&spec.base, self.template.as_ref())
    }

    /// The layers below the first step, lowest first.
    pub fn layers(&self) -> Vec<String> {
        self.template.as_ref().map(|record| record.layers.clone()).unwrap_or_default()
    }

    /// The environment of the template's build steps and sandboxes: the base's, then `PATH` with this template's
    /// venv and npm prefix in front (and `VIRTUAL_ENV`, `NODE_PATH`), then the spec's `env`.
    pub fn env(&self, spec: &TemplateSpec) -> BTreeMap<String, String> {
        let mut env = self.template.as_ref().map(|record| record.env.clone()).unwrap_or_default();
        let mut front = Vec::new();
        if !spec.packages.pip.is_empty() {
            front.push(format!("{VENV_DIR}/bin"));
            env.insert("VIRTUAL_ENV".to_owned(), VENV_DIR.to_owned());
        }
        if !spec.packages.npm.is_empty() {
            front.push(format!("{NPM_PREFIX}/bin"));
            env.insert("NODE_PATH".to_owned(), format!("{NPM_PREFIX}/lib/node_modules"));
        }
        if !front.is_empty() {
            let rest =
                env.get("PATH").cloned().unwrap_or_else(|| sandkasten_jail::environment::SANDBOX_PATH.to_owned());
            for part in rest.split(':') {
                if !front.iter().any(|entry| entry == part) {
                    front.push(part.to_owned());
                }
            }
            env.insert("PATH".to_owned(), front.join(":"));
        }
        env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        env
    }

    /// The working directory: the spec's, else the base's.
    pub fn workdir(&self, spec: &TemplateSpec) -> Option<String> {
        spec.workdir.clone().or_else(|| self.template.as_ref().and_then(|record| record.workdir.clone()))
    }

    /// The sandbox user's name: the spec's, else the base's, else `sandbox`.
    pub fn user(&self, spec: &TemplateSpec) -> String {
        spec.user
            .clone()
            .or_else(|| self.template.as_ref().map(|record| record.user.clone()))
            .unwrap_or_else(|| DEFAULT_USER.to_owned())
    }

    /// The zygote's preload: the base's modules, then the spec's new ones.
    pub fn preload(&self, spec: &TemplateSpec) -> Vec<String> {
        let mut preload = self.template.as_ref().map(|record| record.preload.clone()).unwrap_or_default();
        for module in &spec.preload {
            if !preload.contains(module) {
                preload.push(module.clone());
            }
        }
        preload
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> TemplateSpec {
        TemplateSpec::from_toml(text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn base_record() -> TemplateRecord {
        TemplateRecord {
            name: "tables".into(),
            digest: "sha256:aa".into(),
            base: "host".into(),
            root: Base::Host,
            layers: vec!["l1".into(), "l2".into()],
            env: [
                ("PATH".to_owned(), format!("{VENV_DIR}/bin:/usr/bin:/bin")),
                ("VIRTUAL_ENV".to_owned(), VENV_DIR.to_owned()),
                ("MODE".to_owned(), "base".to_owned()),
            ]
            .into(),
            workdir: Some("/opt/app".into()),
            user: "analyst".into(),
            preload: vec!["tabulate".into()],
            size_bytes: 0,
            created: 0,
        }
    }

    #[test]
    fn a_template_base_passes_on_its_layers_env_workdir_user_and_preload() {
        let base = ResolvedBase { root: Base::Host, template: Some(base_record()) };
        let child = spec(
            "name = \"child\"\nbase = \"tables\"\npreload = [\"json\", \"tabulate\"]\n[packages]\nnpm = [\"x\"]\n\
             [env]\nMODE = \"child\"\n",
        );
        assert_eq!(base.layers(), ["l1", "l2"]);
        let env = base.env(&child);
        assert_eq!(env["PATH"], format!("{NPM_PREFIX}/bin:{VENV_DIR}/bin:/usr/bin:/bin"));
        assert_eq!(env["VIRTUAL_ENV"], VENV_DIR);
        assert_eq!(env["MODE"], "child");
        assert_eq!(base.workdir(&child).as_deref(), Some("/opt/app"));
        assert_eq!(base.user(&child), "analyst");
        assert_eq!(base.preload(&child), ["tabulate", "json"]);
    }

    #[test]
    fn a_rebuilt_base_or_its_env_changes_the_key_below_the_first_step() {
        let child = spec("name = \"child\"\nbase = \"tables\"\n");
        let key = |record: TemplateRecord| ResolvedBase { root: Base::Host, template: Some(record) }.key(&child);
        let mut other_layers = base_record();
        other_layers.digest = "sha256:bb".into();
        let mut other_env = base_record();
        other_env.env.insert("MODE".into(), "other".into());
        assert_ne!(key(base_record()), key(other_layers));
        assert_ne!(key(base_record()), key(other_env));
        assert_eq!(key(base_record()), key(base_record()));
    }

    #[test]
    fn a_host_base_has_no_layers_and_the_sandbox_path() {
        let base = ResolvedBase { root: Base::Host, template: None };
        let env = base.env(&spec("name = \"a\"\nbase = \"host\"\n[packages]\npip = [\"x\"]\n"));
        assert_eq!(env["PATH"], format!("{VENV_DIR}/bin:{}", sandkasten_jail::environment::SANDBOX_PATH));
        assert!(base.layers().is_empty());
    }
}
