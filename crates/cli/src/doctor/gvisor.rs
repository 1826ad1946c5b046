//! The gvisor tier's checks: `runsc` is installed (it answers `--version`), and it actually starts a sandbox
//! (`runsc --network=none --platform=systrap do /bin/true`, within a deadline, with its state in a directory of its
//! own that is removed afterwards). A failed start reports what runsc said.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::host;
use super::report::{Check, CheckId};

/// How to install gVisor.
const INSTALL: &str = "install gVisor for the gvisor tier: scripts/setup.sh installs runsc from bookworm-backports \
    (apt-get install -t bookworm-backports runsc)";
/// What to do when runsc is installed but cannot start a sandbox.
const START_FIX: &str = "runsc is installed but cannot start a sandbox here: fix what it said (run as root, as the \
    server does; if the systrap platform is the problem, try runsc --platform=ptrace do /bin/true)";
/// Longest the start check waits for `runsc do` (it takes well under a second where it works).
const START_DEADLINE: Duration = Duration::from_secs(10);
/// Longest the start check waits for runsc's stderr once runsc has ended.
const STDERR_GRACE: Duration = Duration::from_secs(1);

/// Both checks: `runsc` found and answering, and a sandbox started with it.
pub fn checks() -> Vec<Check> {
    match host::which("runsc") {
        None => vec![
            Check::fail(CheckId::Runsc, "runsc not found in PATH", INSTALL),
            Check::fail(CheckId::RunscStart, "not tried: runsc not found", INSTALL),
        ],
        Some(path) => {
            let version = version(&path);
            let start = if version.status == super::report::Status::Ok {
                start(&path, &state_dir())
            } else {
                Check::fail(CheckId::RunscStart, "not tried: runsc --version failed", INSTALL)
            };
            vec![version, start]
        }
    }
}

/// Asks `runsc` for its version.
fn version(path: &Path) -> Check {
    let output =
        Command::new(path).arg("--version").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).output();
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

/// How a `runsc do` went.
#[derive(Debug)]
enum Started {
    /// It ended by itself, with what it wrote to stderr.
    Ended(ExitStatus, Vec<u8>),
    /// It was still running at the deadline and was killed.
    TimedOut,
    /// It could not be run at all.
    Failed(std::io::Error),
}

/// A fresh directory name for one start's runsc state (`--root`), so that nothing lands in runsc's global one.
fn state_dir() -> PathBuf {
    static STARTS: AtomicUsize = AtomicUsize::new(0);
    let n = STARTS.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("sandkasten-doctor-runsc-{}-{n}", std::process::id()))
}

/// Starts `/bin/true` in a gVisor sandbox (no network, the systrap platform) with its state in `root` (removed
/// afterwards) and reports how that went.
fn start(path: &Path, root: &Path) -> Check {
    let started = std::fs::create_dir_all(root).map_or_else(Started::Failed, |()| run_do(path, root));
    if let Err(e) = std::fs::remove_dir_all(root) {
        tracing::debug!(root = %root.display(), error = %e, "could not remove the runsc state directory");
    }
    start_verdict(&command_line(path), started)
}

/// The command the start check runs, as shown in its detail.
fn command_line(path: &Path) -> String {
    format!("{} --network=none --platform=systrap do /bin/true", path.display())
}

fn run_do(path: &Path, root: &Path) -> Started {
    let spawned = Command::new(path)
        .arg(format!("--root={}", root.display()))
        .args(["--network=none", "--platform=systrap", "do", "/bin/true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => return Started::Failed(e),
    };
    // Read on a thread: the sandbox's own processes may hold the pipe open after runsc itself is gone.
    let (sender, receiver) = mpsc::channel();
    if let Some(mut stderr) = child.stderr.take() {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            stderr.read_to_end(&mut text).ok();
            sender.send(text).ok();
        });
    }
    let deadline = Instant::now() + START_DEADLINE;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Started::Ended(status, receiver.recv_timeout(STDERR_GRACE).unwrap_or_default()),
            Ok(None) if Instant::now() >= deadline => {
                child.kill().ok();
                child.wait().ok();
                return Started::TimedOut;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Started::Failed(e),
        }
    }
}

fn start_verdict(command: &str, started: Started) -> Check {
    match started {
        Started::Ended(status, _) if status.success() => Check::ok(CheckId::RunscStart, format!("{command}: ok")),
        Started::Ended(status, stderr) => {
            let said = host::last_line(&stderr);
            let said = if said.is_empty() { "nothing on stderr".to_owned() } else { said };
            Check::fail(CheckId::RunscStart, format!("{command} exited with {status}: {said}"), START_FIX)
        }
        Started::TimedOut => Check::fail(
            CheckId::RunscStart,
            format!("{command} did not finish within {} s and was killed", START_DEADLINE.as_secs()),
            START_FIX,
        ),
        Started::Failed(e) => Check::fail(CheckId::RunscStart, format!("running {command}: {e}"), INSTALL),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt as _;

    use super::*;
    use crate::doctor::report::Status;

    #[test]
    fn version_is_the_first_non_empty_line() {
        assert_eq!(
            version_line("\nrunsc version release-20221219.0\nspec: 1.0.2-dev\n"),
            "runsc version release-20221219.0"
        );
        assert_eq!(version_line(""), "(no version output)");
    }

    #[test]
    fn a_failed_start_says_what_runsc_said() {
        let stderr = b"W1201 util.go:64] FATAL ERROR: unknown platform: bogus\nunknown platform: bogus\n".to_vec();
        let check = start_verdict("runsc do /bin/true", Started::Ended(ExitStatus::from_raw(128 << 8), stderr));
        assert_eq!(check.status, Status::Fail);
        assert!(check.detail.ends_with("exit status: 128: unknown platform: bogus"), "{}", check.detail);
        assert_eq!(check.fix.as_deref(), Some(START_FIX));
        let check = start_verdict("runsc do /bin/true", Started::TimedOut);
        assert!(check.detail.contains("did not finish within 10 s"), "{}", check.detail);
        let ok = start_verdict("runsc do /bin/true", Started::Ended(ExitStatus::from_raw(0), Vec::new()));
        assert_eq!((ok.status, ok.fix), (Status::Ok, None));
    }

    #[test]
    fn the_install_hint_names_the_setup_script_and_backports() {
        let missing = Check::fail(CheckId::Runsc, "runsc not found in PATH", INSTALL);
        let fix = missing.fix.unwrap_or_default();
        assert!(fix.contains("scripts/setup.sh") && fix.contains("apt-get install -t bookworm-backports runsc"));
    }

    #[test]
    fn on_this_host_the_checks_agree_and_a_start_leaves_no_state() {
        let checks = checks();
        assert_eq!(checks.iter().map(|c| c.id).collect::<Vec<_>>(), [CheckId::Runsc, CheckId::RunscStart]);
        if checks[0].status != Status::Ok {
            assert_eq!(checks[1].status, Status::Fail, "{checks:?}");
            return;
        }
        let (Some(path), root) = (host::which("runsc"), state_dir()) else { return };
        let check = start(&path, &root);
        assert!(check.detail.contains("--network=none --platform=systrap do /bin/true"), "{check:?}");
        assert!(!root.exists(), "{} was left behind", root.display());
    }
}
