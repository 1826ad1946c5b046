//! Where the suites that drive a real client program (the E2B SDKs, the Python SDK, the MCP client) find the
//! repository and the pinned venv their setup script made, failing with the script to run when it is missing.

use std::path::{Path, PathBuf};

/// The repository's root (venvs, suites and examples are found from here).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repo root")
}

/// The Python of `target/VENV`, or a failure saying that `scripts/SETUP` (run by `scripts/setup.sh`, so by CI)
/// makes it, with `what` it installs: a missing venv fails the test rather than skipping it, so that a broken
/// install cannot hide a broken server.
pub fn venv_python(venv: &str, setup: &str, what: &str) -> PathBuf {
    let python = repo_root().join("target").join(venv).join("bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/{setup} (scripts/setup.sh and CI run it) to install {what}",
        python.display()
    );
    python
}
