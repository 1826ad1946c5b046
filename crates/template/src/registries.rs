//! Which hosts a build sandbox may reach: the package registries, as the host's own clients are configured at build
//! time (npm's `registry`; pip's `global.index-url`, else pip's built-in index and file host; the Debian mirrors of
//! `/etc/apt/sources.list*`), unless the operator names them (`[templates] registries`). No registry's name is
//! written here: what the host's clients say is what a build may use.

use std::process::Command;

use crate::spec::TemplateSpec;

/// The host (with `:port`) of an `http(s)://` URL, as an egress allow pattern.
pub fn host_pattern(url: &str) -> Option<String> {
    let (scheme, rest) = url.trim().split_once("://")?;
    let default_port = match scheme {
        "https" => 443,
        "http" => 80,
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    if authority.is_empty() {
        return None;
    }
    let has_port = authority.rsplit_once(':').is_some_and(|(_, port)| port.parse::<u16>().is_ok());
    Some(if has_port { authority.to_owned() } else { format!("{authority}:{default_port}") })
}

fn output_of(program: &str, args: &[&str]) -> Option<String> {
    let output = Command::new(program).args(args).output().ok()?;
    output.status.success().then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned()).filter(|s| !s.is_empty())
}

/// pip's index and file hosts: its configured `index-url` (and `extra-index-url`), else its built-in defaults.
fn pip_hosts(python: &str) -> Vec<String> {
    let configured: Vec<String> = ["global.index-url", "global.extra-index-url"]
        .iter()
        .filter_map(|key| output_of(python, &["-m", "pip", "config", "get", key]))
        .flat_map(|value| value.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .collect();
    if !configured.is_empty() {
        return configured.iter().filter_map(|url| host_pattern(url)).collect();
    }
    let builtin = "from pip._internal.models.index import PyPI; print(PyPI.pypi_url); \
                   print('https://' + PyPI.file_storage_domain)";
    output_of(python, &["-c", builtin]).map(|text| text.lines().filter_map(host_pattern).collect()).unwrap_or_default()
}

/// npm's registry host.
fn npm_hosts() -> Vec<String> {
    output_of("npm", &["config", "get", "registry"]).and_then(|url| host_pattern(&url)).into_iter().collect()
}

/// The hosts of the Debian mirrors in `/etc/apt/sources.list` and `sources.list.d/*` (one-line and deb822 forms).
fn apt_hosts() -> Vec<String> {
    let mut texts: Vec<String> = std::fs::read_to_string("/etc/apt/sources.list").into_iter().collect();
    if let Ok(entries) = std::fs::read_dir("/etc/apt/sources.list.d") {
        texts.extend(entries.flatten().filter_map(|e| std::fs::read_to_string(e.path()).ok()));
    }
    texts
        .iter()
        .flat_map(|text| text.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .filter_map(|word| host_pattern(&word))
        .collect()
}

/// The TLS roots the host's clients are configured with (npm's `cafile`, pip's `global.cert`), as the build steps'
/// environment (`NPM_CONFIG_CAFILE`, `PIP_CERT`): only files a sandbox sees too (under the host's `/etc/ssl` or
/// `/usr`), so a registry behind a local CA works in the build as on the host.
pub fn client_trust(spec: &TemplateSpec, python: &str) -> std::collections::BTreeMap<String, String> {
    let visible = |path: &String| {
        (path.starts_with("/etc/ssl/") || path.starts_with("/usr/")) && std::path::Path::new(path).is_file()
    };
    let mut env = std::collections::BTreeMap::new();
    if !spec.packages.npm.is_empty()
        && let Some(cafile) = output_of("npm", &["config", "get", "cafile"]).filter(visible)
    {
        env.insert("NPM_CONFIG_CAFILE".to_owned(), cafile);
    }
    if !spec.packages.pip.is_empty()
        && let Some(cert) = output_of(python, &["-m", "pip", "config", "get", "global.cert"]).filter(visible)
    {
        env.insert("PIP_CERT".to_owned(), cert);
    }
    env
}

/// The registries a build of `spec` needs, from the host's clients (`python` is the interpreter whose pip the build
/// uses). Empty when the spec installs no packages.
pub fn discover(spec: &TemplateSpec, python: &str) -> Vec<String> {
    let mut hosts = Vec::new();
    if !spec.packages.pip.is_empty() {
        hosts.extend(pip_hosts(python));
    }
    if !spec.packages.npm.is_empty() {
        hosts.extend(npm_hosts());
    }
    if !spec.packages.apt.is_empty() {
        hosts.extend(apt_hosts());
    }
    hosts.sort();
    hosts.dedup();
    hosts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_become_host_patterns_with_their_port() {
        assert_eq!(host_pattern("https://index.example.org/simple/").as_deref(), Some("index.example.org:443"));
        assert_eq!(host_pattern("http://mirror.example.net:8080/debian").as_deref(), Some("mirror.example.net:8080"));
        assert_eq!(host_pattern("https://user:pw@repo.example.com").as_deref(), Some("repo.example.com:443"));
        assert_eq!(host_pattern("file:///srv/wheels"), None);
        assert_eq!(host_pattern("main"), None);
    }
}
