//! The gvisor tier's check: `runsc` is installed and answers `--version`.

use std::process::{Command, Stdio};

use super::host;
use super::report::{Check, CheckId};

/// How to install gVisor.
const INSTALL: &str = "install gVisor for the gvisor tier: apt-get install runsc (Debian), or see https://gvisor.dev/docs/user_guide/install/";

/// Finds `runsc` and asks for its version.
pub fn runsc() -> Check {
    let Some(path) = host::which("runsc") else {
        return Check::fail(CheckId::Runsc, "runsc not found in PATH", INSTALL);
    };
    let output = Command::new(&path)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output();
    match output {
        Ok(output) if output.status.success() => {
            let stdout = String::from_utf8_lossy(&output.stdout);
            Check::ok(CheckId::Runsc, format!("{}: {}", path.display(), version_line(&stdout)))
        }
        Ok(output) => Check::fail(
            CheckId::Runsc,
            format!("{} --version exited with {}: {}", path.display(), output.status, host::last_line(&output.stderr)),
            INSTALL,
        ),
        Err(e) => Check::fail(CheckId::Runsc, format!("running {}: {e}", path.display()), INSTALL),
    }
}

/// The first line of `runsc --version` (`runsc version release-20221219.0`), or a placeholder.
pub fn version_line(stdout: &str) -> &str {
    stdout.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("(no version output)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_is_the_first_non_empty_line() {
        assert_eq!(
            version_line("\nrunsc version release-20221219.0\nspec: 1.0.2-dev\n"),
            "runsc version release-20221219.0"
        );
        assert_eq!(version_line(""), "(no version output)");
    }
}
