//! `[templates]`: where the server finds built templates (`cache`, what `{"template": NAME}` names), and what
//! template builds (`sandkasten template build --config FILE`) may reach. Unset, the registries come from the host's
//! own pip, npm and apt configuration at build time.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::problem::Found;

/// Template builds (`[templates]`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TemplatesConfig {
    /// The template cache built templates are read from (`sandkasten template build --cache DIR` writes it). Default:
    /// `/var/lib/sandkasten/templates`, the CLI's default too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<std::path::PathBuf>,
    /// Host patterns (`name`, `*.name`, each with an optional `:port`) a build step may reach through the egress
    /// proxy, replacing the registries read from the host's clients. Default: empty (read from the host). The
    /// build's proxy uses `[egress]` too (`allow_cidrs` for a registry mirror on a private network).
    pub registries: Vec<String>,
    /// Share templates through the template store beside the snapshot store (`[snapshots] store` with `/templates`
    /// appended): a template built through the API is pushed there when its build ends, and a create or run naming a
    /// template this host's cache lacks pulls it from there first (`sandkasten template push/pull` do the same by
    /// hand). Default false.
    pub share: bool,
}

impl TemplatesConfig {
    /// The template cache's directory (`cache`, or the default).
    pub fn cache_root(&self) -> std::path::PathBuf {
        self.cache.clone().unwrap_or_else(|| sandkasten_template::cache::DEFAULT_ROOT.into())
    }

    /// Records what is wrong with these values.
    pub(crate) fn check(&self, found: &mut Found) {
        if let Some(cache) = &self.cache {
            if !cache.is_absolute() {
                found.add("templates.cache", format!("{} is not an absolute path", cache.display()));
            } else if cache.starts_with("/tmp") {
                found
                    .add("templates.cache", "is under /tmp, which sandboxes cover with their own root: choose another");
            }
        }
        for (index, pattern) in self.registries.iter().enumerate() {
            if let Err(error) = sandkasten_egress::Pattern::parse("registries", pattern) {
                found.add(format!("templates.registries[{index}]"), error.reason);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::ServerConfig;

    #[test]
    fn a_bad_registry_pattern_is_named() {
        let text = "insecure_no_auth = true\n[templates]\nregistries = [\"ok.example.org:443\", \"bad host\"]\n";
        let config = ServerConfig::from_toml_str(text).unwrap_or_else(|e| panic!("{e}"));
        let error = config.validate().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("templates.registries[1]"), "{error}");
    }
}
