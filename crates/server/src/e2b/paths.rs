//! E2B's paths: absolute, or relative to the user's home `/home/user` (where a facade sandbox's writable home is,
//! see the `e2b` template), checked like every path the server hands to a runtime.

use crate::e2b::error::E2bError;

/// The home and default working directory E2B programs expect.
pub(crate) const E2B_HOME: &str = "/home/user";

/// The absolute sandbox path of an E2B path (relative paths are under the home), without a trailing slash.
pub(crate) fn to_sandbox(path: &str) -> Result<String, E2bError> {
    if path.is_empty() {
        return Err(E2bError::invalid("the path is empty"));
    }
    let absolute = if path.starts_with('/') { path.to_owned() } else { format!("{E2B_HOME}/{path}") };
    let trimmed = absolute.trim_end_matches('/');
    let trimmed = if trimmed.is_empty() { "/" } else { trimmed };
    crate::validate::sandbox_path("path", trimmed).map_err(E2bError::invalid)?;
    Ok(trimmed.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_under_the_home() {
        assert_eq!(to_sandbox("/home/user/a/b.txt").ok().as_deref(), Some("/home/user/a/b.txt"));
        assert_eq!(to_sandbox("a.txt").ok().as_deref(), Some("/home/user/a.txt"));
        assert_eq!(to_sandbox("/home/user/dir/").ok().as_deref(), Some("/home/user/dir"));
        assert_eq!(to_sandbox("/tmp/x").ok().as_deref(), Some("/tmp/x"));
        assert_eq!(to_sandbox("/").ok().as_deref(), Some("/"));
        assert!(to_sandbox("").is_err());
        assert!(to_sandbox("/home/user/../../etc/passwd").is_err());
    }
}
