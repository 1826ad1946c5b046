//! E2B's paths and sandkasten's. E2B programs assume the user `user` with home and working directory
//! `/home/user`; a sandkasten sandbox's writable home is `/workspace`. The facade maps `/home/user` (and relative
//! paths, which E2B resolves against the home) to `/workspace` on the way in and back on the way out, so a client
//! only ever sees `/home/user`.

use crate::e2b::error::E2bError;

/// The home and default working directory E2B programs expect.
pub(crate) const E2B_HOME: &str = "/home/user";
/// Where that is in a sandkasten sandbox.
pub(crate) const SANDBOX_HOME: &str = "/workspace";

fn replace_prefix(path: &str, from: &str, to: &str) -> Option<String> {
    let rest = path.strip_prefix(from)?;
    (rest.is_empty() || rest.starts_with('/')).then(|| format!("{to}{rest}"))
}

/// The sandbox path of an E2B path: `/home/user/…` and relative paths go under `/workspace`.
pub(crate) fn to_sandbox(path: &str) -> Result<String, E2bError> {
    if path.is_empty() {
        return Err(E2bError::invalid("the path is empty"));
    }
    let absolute = if path.starts_with('/') { path.to_owned() } else { format!("{E2B_HOME}/{path}") };
    let trimmed = if absolute.len() > 1 { absolute.trim_end_matches('/') } else { absolute.as_str() };
    let trimmed = if trimmed.is_empty() { "/" } else { trimmed };
    let mapped = replace_prefix(trimmed, E2B_HOME, SANDBOX_HOME).unwrap_or_else(|| trimmed.to_owned());
    crate::validate::sandbox_path("path", &mapped).map_err(E2bError::invalid)?;
    Ok(mapped)
}

/// The E2B path of a sandbox path: `/workspace/…` is shown as `/home/user/…`.
pub(crate) fn to_e2b(path: &str) -> String {
    replace_prefix(path, SANDBOX_HOME, E2B_HOME).unwrap_or_else(|| path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_and_relative_paths_map_to_the_workspace() {
        assert_eq!(to_sandbox("/home/user").ok().as_deref(), Some("/workspace"));
        assert_eq!(to_sandbox("/home/user/a/b.txt").ok().as_deref(), Some("/workspace/a/b.txt"));
        assert_eq!(to_sandbox("a.txt").ok().as_deref(), Some("/workspace/a.txt"));
        assert_eq!(to_sandbox("/home/user/dir/").ok().as_deref(), Some("/workspace/dir"));
        assert_eq!(to_sandbox("/home/username").ok().as_deref(), Some("/home/username"));
        assert_eq!(to_sandbox("/tmp/x").ok().as_deref(), Some("/tmp/x"));
        assert_eq!(to_sandbox("/").ok().as_deref(), Some("/"));
        assert!(to_sandbox("").is_err());
    }

    #[test]
    fn workspace_paths_are_shown_as_home() {
        assert_eq!(to_e2b("/workspace/a"), "/home/user/a");
        assert_eq!(to_e2b("/workspace"), "/home/user");
        assert_eq!(to_e2b("/workspaces"), "/workspaces");
        assert_eq!(to_e2b("/tmp/a"), "/tmp/a");
    }
}
