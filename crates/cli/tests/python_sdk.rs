//! The Python SDK (`sdk/python`, package `sandkasten`) against a real `sandkasten serve`: the package is built and
//! installed the way a user installs it (`pip install ./sdk/python`, here into a fresh directory on every run, so the
//! suite always tests the current source and never the source tree itself), then its own pytest suite
//! (`sdk/python/tests`: sync and async, errors, streaming, files, code, pause/snapshot/fork, and the drift check
//! against docs/api/openapi.json) runs with SANDKASTEN_URL / SANDKASTEN_API_KEY pointing at the server. It must pass
//! whole, skip nothing, call every operation the SDK declares on both surfaces (the suite's own session check), and
//! afterwards no sandbox it created may have left anything on the host. It runs once per tier: the server's default
//! tier is the tier under test, so every sandbox the suite creates without naming one is of it (the suite checks).
//!
//! The venv comes from `scripts/setup-python-sdk.sh` (run by `scripts/setup.sh`, so by CI): a missing one fails the
//! test rather than skipping it, so that a broken install cannot hide a broken SDK.

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Tier;
use serve::{Server, assert_sandbox_gone_on, children_of};

/// Longest the install or the suite may take on `tier` before it is killed and the test fails; the suite takes about
/// 30 s on the process tier (half of it mypy), 45 s on gVisor and about 3 minutes on microVMs under software emulation
/// (a boot of seconds per sandbox it creates), but more than 5.5 minutes were seen beside the rest of CI's suite (its
/// two cores shared with other VMs' emulation). Below nextest's own limit for the test (.config/nextest.toml).
fn client_limit(tier: Tier) -> Duration {
    match tier {
        Tier::Microvm => Duration::from_secs(570),
        _ => Duration::from_secs(170),
    }
}

/// The suite's Python.
fn venv_python() -> PathBuf {
    common::venvs::venv_python("python-sdk-venv", "setup-python-sdk.sh", "the SDK's pinned test tools")
}

/// Runs `python args…` in the repository with only PATH, HOME and `env`, under a watchdog; prints its output (nextest
/// shows it on failure) and returns whether it succeeded, with the output.
fn run_python(args: &[&str], env: &[(&str, &str)], limit: Duration, log_path: &Path) -> (bool, String) {
    let log = std::fs::File::create(log_path).expect("create the log");
    let mut child = Command::new(venv_python())
        .args(args)
        .current_dir(common::venvs::repo_root())
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONUNBUFFERED", "1")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("dup the log"))
        .stderr(log)
        .spawn()
        .expect("start the venv's python");
    let deadline = Instant::now() + limit;
    let (success, timed_out) = loop {
        if let Some(status) = child.try_wait().expect("wait for python") {
            break (status.success(), false);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break (false, true);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = std::fs::read_to_string(log_path).unwrap_or_default();
    println!("--- python {args:?} ---\n{output}--- end ---");
    assert!(!timed_out, "python {args:?} did not finish within {limit:?} and was killed");
    (success, output)
}

/// Builds the SDK from `sdk/python` with its declared backend and installs it into `target` (no registry: the
/// backend is in the venv, and httpx, its one dependency, too).
fn install_sdk(target: &Path, limit: Duration, log: &Path) {
    let target = target.to_str().expect("utf-8 path");
    let args = [
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "--target",
        target,
        "./sdk/python",
    ];
    let (success, _) = run_python(&args, &[], limit, log);
    assert!(success, "pip install ./sdk/python failed (its output is above)");
    let installed = Path::new(target).join("sandkasten");
    assert!(installed.join("py.typed").exists(), "the installed package lacks py.typed (PEP 561 typing marker)");
}

/// Sandbox agents still running under the server (its spawner's children).
fn running_agents(server: &Server) -> Vec<u32> {
    children_of(server.pid()).into_iter().flat_map(children_of).collect()
}

per_tier!(python_sdk_passes_its_suite_against_a_real_server);

/// An admin tenant: the suite reads `GET /v1/config` with its key.
const ADMIN_KEY: &str = "ops-key-0123456789abcdefghij";

fn python_sdk_passes_its_suite_against_a_real_server(tier: Tier) {
    // The suite builds a template (`client.templates.build`): into a cache of its own, not the host's.
    let templates = tempfile::Builder::new().prefix("sk-sdk-templates-").tempdir_in("/var/tmp").expect("cache dir");
    let admin = format!(
        "[templates]\ncache = \"{}\"\n\n[[tenants]]\nname = \"ops\"\napi_keys = [\"{ADMIN_KEY}\"]\nadmin = true\n\
         max_sandboxes = 1\n",
        templates.path().display()
    );
    let server = Server::start_with_on(tier, &admin);
    let scratch = tempfile::tempdir().expect("tempdir");
    let site = scratch.path().join("site");
    install_sdk(&site, client_limit(tier), &scratch.path().join("install.log"));
    let ids_file = scratch.path().join("sandbox-ids");
    let env = [
        ("PYTHONPATH", site.to_str().expect("utf-8 path")),
        ("SANDKASTEN_URL", server.url.as_str()),
        ("SANDKASTEN_API_KEY", serve::KEY_1),
        ("SANDKASTEN_SUITE_OTHER_API_KEY", serve::KEY_2),
        ("SANDKASTEN_SUITE_ADMIN_API_KEY", ADMIN_KEY),
        ("SANDKASTEN_SUITE_IDS_FILE", ids_file.to_str().expect("utf-8 path")),
        ("SANDKASTEN_SUITE_TIER", tier.name()),
    ];
    let mut args = vec!["-m", "pytest", "sdk/python/tests", "-q", "-rfEsx", "--tb=short", "-p", "no:cacheprovider"];
    if tier != Tier::Process {
        // Type-checking the package (mypy, no server) does not depend on the tier: once is enough.
        args.push("--ignore=sdk/python/tests/test_types.py");
    }
    let (success, output) = run_python(&args, &env, client_limit(tier), &scratch.path().join("suite.log"));
    assert!(success, "the SDK's pytest suite failed (its output is above)");
    assert!(!output.contains(" skipped"), "tests of the SDK suite were skipped (see the output above)");
    assert!(output.contains(" passed"), "the SDK suite ran no test");

    let ids: Vec<String> =
        std::fs::read_to_string(&ids_file).unwrap_or_default().lines().map(str::trim).map(str::to_owned).collect();
    // The suite creates well over ten sandboxes; fewer recorded ids means the record, not the server, is broken.
    assert!(ids.len() >= 10, "the suite recorded {} sandbox ids: {ids:?}", ids.len());
    for id in &ids {
        assert_sandbox_gone_on(tier, id);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !running_agents(&server).is_empty() {
        assert!(
            Instant::now() < deadline,
            "sandbox agents still running after the suite: {:?}",
            running_agents(&server)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
