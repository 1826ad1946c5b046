//! The sandboxed program's environment, built from scratch: nothing of the host's environment gets in.

use std::collections::BTreeMap;

/// PATH inside every sandbox: the system's, then the agent's run directory's `bin` (the sandbox's `sudo`, last so that
/// a template's own `sudo` would win).
pub const SANDBOX_PATH: &str = "/usr/local/bin:/usr/bin:/bin:/.sandkasten/run/bin";

/// The names of the base environment `build` sets.
pub const BASE_NAMES: [&str; 3] = ["PATH", "HOME", "LANG"];

/// The base environment (PATH, HOME, LANG: the least that makes programs behave) plus the caller's variables, which
/// may override the base but never come from the host implicitly. The user's name is in the synthesised
/// `/etc/passwd`, so `getpass.getuser()`, `id` and `whoami` work without USER.
pub fn build(home: &str, extra: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut env = BTreeMap::from([
        ("PATH".to_owned(), SANDBOX_PATH.to_owned()),
        ("HOME".to_owned(), home.to_owned()),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
    ]);
    env.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// Whether `name` is acceptable as an environment variable name (non-empty, no `=`, no NUL).
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('=') && !name.contains('\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_environment_never_enters() {
        let host_has_something = std::env::vars().count() > 0;
        let env = build("/workspace", &BTreeMap::new());
        assert!(host_has_something);
        for (key, _) in std::env::vars() {
            if !env.contains_key(&key) {
                continue;
            }
            assert!(["PATH", "HOME", "LANG"].contains(&key.as_str()));
        }
        assert_eq!(env["PATH"], SANDBOX_PATH);
    }

    #[test]
    fn the_path_ends_with_the_agent_s_run_directory_where_sudo_is() {
        let last = SANDBOX_PATH.rsplit(':').next().unwrap_or_default();
        assert_eq!(last, format!("{}/bin", crate::rootfs::AGENT_RUN_DIR));
    }

    #[test]
    fn caller_variables_are_added() {
        let env = build("/workspace", &BTreeMap::from([("A".to_owned(), "1".to_owned())]));
        assert_eq!(env["A"], "1");
        assert!(!is_valid_name("A=B"));
        assert!(!is_valid_name(""));
    }
}
