//! The unmodified E2B SDKs against a real `sandkasten serve`: the pytest suite in `tests/e2b` (sync and async clients
//! of `e2b` and `e2b-code-interpreter`; its outcomes must also be what docs/e2b-compat.md's compatibility matrix says
//! for these pinned versions), the "done when" script `examples/e2b_quickstart.py`, and of the npm packages
//! `e2b` and `@e2b/code-interpreter` a smoke test (`tests/e2b-node/smoke.cjs`) and the core calls
//! (`tests/e2b-node/core.test.cjs`), run with only E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY
//! pointing at the server, under a tenant whose key has E2B's `e2b_…` format. Each must pass as a whole, and
//! afterwards no sandbox it created may have left anything on the host.
//!
//! The venv and node_modules come from `scripts/setup-e2b.sh` (run by `scripts/setup.sh`, so by CI): a missing one
//! fails the test rather than skipping it, so that a broken install cannot hide a broken facade.

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod egress;
mod serve;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serve::{Server, assert_sandbox_gone, children_of};

/// The tenant key, in E2B's format (`e2b_` and 40 hex digits), as a user would paste it into E2B_API_KEY.
const E2B_KEY: &str = "e2b_53ae1fed82754c17ad8077fbc8bcdd90c6d3f1a2";

/// Longest one client run (the whole pytest suite, the example, the node smoke test) may take before it is killed and
/// the test fails; the suite takes about 55 s (its code-interpreter timeouts wait out real seconds).
const CLIENT_LIMIT: Duration = Duration::from_secs(180);

/// The suite's Python.
fn venv_python() -> PathBuf {
    common::venvs::venv_python("e2b-venv", "setup-e2b.sh", "the pinned E2B SDKs")
}

/// A server with one more tenant, `e2b`, whose key is [`E2B_KEY`].
fn start_server() -> Server {
    start_server_with("")
}

/// The `e2b` tenant's table.
fn e2b_tenant() -> String {
    format!(
        "[[tenants]]\nname = \"e2b\"\napi_keys = [\"{E2B_KEY}\"]\nmax_sandboxes = 32\nmax_memory_bytes = {}\n",
        16u64 << 30
    )
}

/// `start_server` with more config before the tenant table (e.g. `[defaults] isolation = "gvisor"`).
fn start_server_with(extra: &str) -> Server {
    Server::start_with(&format!("{extra}{}", e2b_tenant()))
}

/// What one run of an SDK client program did.
struct ClientRun {
    /// Whether it exited 0.
    success: bool,
    /// Its stdout and stderr, interleaved.
    output: String,
}

/// Runs `program args…` in `cwd` with nothing of the test's environment but PATH, HOME, `extra_env` and the E2B
/// variables pointing at `server` (plus the suite's `E2B_SUITE_IDS_FILE` and `E2B_SUITE_OTHER_API_KEY`, tenant t2's
/// key for the isolation tests), under a watchdog. Its output is printed (nextest shows it on failure) and returned.
fn run_client(
    server: &Server,
    program: &Path,
    args: &[&str],
    cwd: &Path,
    ids_file: &Path,
    extra_env: &[(&str, &Path)],
) -> ClientRun {
    let log_path = ids_file.with_extension("log");
    let log = std::fs::File::create(&log_path).expect("create the client log");
    let mut child = Command::new(program)
        .args(args)
        .current_dir(cwd)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
        .env("E2B_API_URL", &server.url)
        .env("E2B_SANDBOX_URL", &server.url)
        .env("E2B_API_KEY", E2B_KEY)
        .env("E2B_SUITE_IDS_FILE", ids_file)
        .env("E2B_SUITE_OTHER_API_KEY", serve::KEY_2)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("dup the log"))
        .stderr(log)
        .envs(extra_env.iter().copied())
        .spawn()
        .unwrap_or_else(|error| panic!("start {}: {error}", program.display()));
    let deadline = Instant::now() + CLIENT_LIMIT;
    let (success, timed_out) = loop {
        if let Some(status) = child.try_wait().expect("wait for the client") {
            break (status.success(), false);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break (false, true);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    println!("--- {} {args:?} ---\n{output}--- end ---", program.display());
    assert!(!timed_out, "{} {args:?} did not finish within {CLIENT_LIMIT:?} and was killed", program.display());
    ClientRun { success, output }
}

/// Writes the sandbox id a client printed as `sandbox <id> created` to `ids_file`.
fn record_printed_id(run: &ClientRun, ids_file: &Path) {
    let id = run
        .output
        .lines()
        .find_map(|line| line.strip_prefix("sandbox ")?.strip_suffix(" created"))
        .expect("the client printed its sandbox id");
    std::fs::write(ids_file, format!("{id}\n")).expect("record the id");
}

/// Sandbox agents still running under the server (its spawner's children).
fn running_agents(server: &Server) -> Vec<u32> {
    children_of(server.pid()).into_iter().flat_map(children_of).collect()
}

/// Asserts every sandbox listed in `ids_file` (at least `min` of them) is gone from the host, and that the server
/// runs no sandbox any more.
fn assert_nothing_left(server: &Server, ids_file: &Path, min: usize) {
    let ids: Vec<String> = std::fs::read_to_string(ids_file)
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect();
    assert!(ids.len() >= min, "the suite recorded {} sandbox ids, expected at least {min}: {ids:?}", ids.len());
    for id in &ids {
        // The facade hands out sandkasten's own ids; were that to change, the host checks below would look for the
        // wrong names and prove nothing.
        let shaped = id.len() == 19 && id.starts_with("sb-") && id[3..].bytes().all(|b| b.is_ascii_hexdigit());
        assert!(shaped, "E2B sandbox id {id:?} is not a sandkasten id: the leak check needs the mapping");
        assert_sandbox_gone(id);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let agents = running_agents(server);
        if agents.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "sandbox agents still running after the suite: {agents:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn e2b_python_sdks_pass_the_compatibility_suite() {
    require_root!();
    let server = start_server();
    let scratch = tempfile::tempdir().expect("tempdir");
    let ids_file = scratch.path().join("sandbox-ids");
    let report = scratch.path().join("report.jsonl");
    let args = ["-m", "pytest", "tests/e2b", "-q", "-rfEsx", "--tb=short"];
    let repo = common::venvs::repo_root();
    let run = run_client(&server, &venv_python(), &args, &repo, &ids_file, &[("E2B_SUITE_REPORT", &report)]);
    assert!(run.success, "the E2B pytest suite failed (its output is above)");
    // Skips are for runs by hand without a full environment; here every test must run (xfails are the documented gaps).
    assert!(!run.output.contains(" skipped"), "tests of the E2B suite were skipped (see the output above)");
    // The suite creates well over ten sandboxes; fewer recorded ids means the record, not the server, is broken.
    assert_nothing_left(&server, &ids_file, 10);
    // The committed compatibility matrix's column of the pinned versions is what this run did.
    let check = Command::new("/usr/bin/python3")
        .arg(repo.join("tests/e2b/compat_matrix.py"))
        .arg("--check")
        .arg("--report")
        .arg(&report)
        .output()
        .expect("run tests/e2b/compat_matrix.py");
    let said = format!("{}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr));
    assert!(check.status.success(), "docs/e2b-compat.md's matrix does not match this run:\n{said}");
}

/// A secret made with E2B's `Secret` API and named in `network.rules` (`tests/e2b/secret_headers.py`, sync and
/// async) is set as the header toward its host over intercepted TLS, overriding the sandbox's own; a new value
/// applies at once; after `Secret.destroy` no value goes out. Checked in the test host's own request log.
#[test]
fn e2b_secrets_are_set_as_headers_toward_a_test_host() {
    require_root!();
    let world = egress::World::start(&e2b_tenant());
    let scratch = tempfile::tempdir().expect("tempdir");
    let ids_file = scratch.path().join("sandbox-ids");
    let (value, rotated) = ("e2b-s3cret-0123456789", "e2b-r0tated-9876543210");
    let env = [
        ("E2B_SUITE_HEADER_HOST", Path::new("secure.test")),
        ("E2B_SUITE_SECRET_VALUE", Path::new(value)),
        ("E2B_SUITE_ROTATED_VALUE", Path::new(rotated)),
    ];
    let args = ["-m", "pytest", "-q", "-rfEsx", "--tb=short", "tests/e2b/secret_headers.py"];
    let run = run_client(&world.server, &venv_python(), &args, &common::venvs::repo_root(), &ids_file, &env);
    assert!(run.success, "tests/e2b/secret_headers.py failed (its output is above)");
    assert!(run.output.contains("2 passed") && !run.output.contains("skipped"), "both ran: {}", run.output);
    let log = world.secure.requests();
    let request = |path: &str| -> String {
        let start = log.find(&format!("GET {path}\n")).unwrap_or_else(|| panic!("{path} never arrived:\n{log}"));
        let rest = &log[start + 4..];
        rest[..rest.find("\nGET ").map_or(rest.len(), |end| end + 1)].to_owned()
    };
    for (path, expected) in [("/e2b-rule-sync", value), ("/e2b-rule-rotated", rotated), ("/e2b-rule-async", value)] {
        let seen = request(path);
        assert!(seen.contains(&format!("Bearer {expected}")), "{path} lacks the secret's header:\n{seen}");
        assert!(!seen.contains("chosen-inside"), "{path}: the rule overrides the sandbox's header:\n{seen}");
    }
    if let Some(start) = log.find("GET /e2b-rule-deleted\n") {
        let after = &log[start..];
        assert!(!after.contains(value) && !after.contains(rotated), "a destroyed secret still went out:\n{after}");
    }
    for other in [world.allowed.requests(), world.other.requests()] {
        assert!(!other.contains(value) && !other.contains(rotated), "a secret reached another host:\n{other}");
    }
    assert_nothing_left(&world.server, &ids_file, 2);
}

/// The "done when": an E2B-style script, unchanged but for the three variables, creates a sandbox, streams
/// command output, writes/reads/lists files, keeps Python state across run_code calls, saves a matplotlib PNG and
/// kills the sandbox.
#[test]
fn e2b_quickstart_example_runs_unchanged() {
    require_root!();
    quickstart_on(&start_server());
}

/// The same example, unchanged, on a server whose sandboxes are gVisor's (`[defaults] isolation = "gvisor"`: the E2B
/// SDK names no tier, so the server's default applies).
#[test]
fn e2b_quickstart_example_runs_unchanged_on_gvisor() {
    require_runsc!();
    quickstart_on(&start_server_with("[defaults]\nisolation = \"gvisor\"\n"));
}

/// The suite's tests whose behaviour depends on the tier, with the real SDKs, sync and async, on a gVisor server:
/// pauses (with memory: a checkpoint; to the filesystem: the files saved, the sandbox released and made again) and
/// directory watches (inotify inside gVisor's kernel).
#[test]
fn e2b_pause_and_watch_tests_pass_on_gvisor() {
    require_runsc!();
    let server = start_server_with("[defaults]\nisolation = \"gvisor\"\n");
    let scratch = tempfile::tempdir().expect("tempdir");
    let ids_file = scratch.path().join("sandbox-ids");
    let suites = ["tests/e2b/test_lifecycle.py", "tests/e2b/test_async.py", "tests/e2b/test_files.py"];
    let mut args = vec!["-m", "pytest", "-q", "-rfEsx", "--tb=short", "-k", "pause or auto_resume or watch"];
    args.extend(suites);
    let run = run_client(&server, &venv_python(), &args, &common::venvs::repo_root(), &ids_file, &[]);
    assert!(run.success, "the E2B pause and watch tests failed on gVisor (their output is above)");
    assert!(run.output.contains("14 passed"), "every pause and watch test ran: {}", run.output);
    assert_nothing_left(&server, &ids_file, 3);
}

/// The base image's tests with the real SDKs on a gVisor server: `python`, `pip`, `node`, `git`, `curl` and the home
/// under the Sentry, a command cut off by a kill raising the SDK's "killed or reached its end of life", `mcp` failing
/// as a failed gateway does, `sudo` (the agent's, under the Sentry) and the home's skeleton.
#[test]
fn e2b_base_image_tests_pass_on_gvisor() {
    require_runsc!();
    let server = start_server_with("[defaults]\nisolation = \"gvisor\"\n");
    let scratch = tempfile::tempdir().expect("tempdir");
    let ids_file = scratch.path().join("sandbox-ids");
    let args = ["-m", "pytest", "-q", "-rfEsx", "--tb=short", "tests/e2b/test_base_image.py"];
    let run = run_client(&server, &venv_python(), &args, &common::venvs::repo_root(), &ids_file, &[]);
    assert!(run.success, "the E2B base image tests failed on gVisor (their output is above)");
    assert!(run.output.contains("7 passed in"), "every test ran: {}", run.output);
    assert_nothing_left(&server, &ids_file, 3);
}

/// The code interpreter's tests (envs, working directories, restarts and interrupts, a kill during a cell,
/// JavaScript, bash, display and charts) with the real SDKs on a gVisor server: its kernels run under the Sentry.
#[test]
fn e2b_code_interpreter_tests_pass_on_gvisor() {
    require_runsc!();
    let server = start_server_with("[defaults]\nisolation = \"gvisor\"\n");
    let scratch = tempfile::tempdir().expect("tempdir");
    let ids_file = scratch.path().join("sandbox-ids");
    let args = ["-m", "pytest", "-q", "-rfEsx", "--tb=short", "tests/e2b/test_code_interpreter.py"];
    let run = run_client(&server, &venv_python(), &args, &common::venvs::repo_root(), &ids_file, &[]);
    assert!(run.success, "the E2B code interpreter tests failed on gVisor (their output is above)");
    assert!(!run.output.contains(" skipped") && !run.output.contains("xfail"), "every test ran: {}", run.output);
    assert_nothing_left(&server, &ids_file, 3);
}

fn quickstart_on(server: &Server) {
    let scratch = tempfile::tempdir().expect("tempdir");
    let ids_file = scratch.path().join("sandbox-ids");
    let script = common::venvs::repo_root().join("examples/e2b_quickstart.py");
    let run =
        run_client(server, &venv_python(), &[script.to_str().expect("utf-8 path")], scratch.path(), &ids_file, &[]);
    assert!(run.success, "examples/e2b_quickstart.py failed (its output is above)");
    for expected in ["stdout: hello from user in /home/user", "stderr: done", "numbers.csv", "sum of y: 14", "killed"] {
        assert!(run.output.contains(expected), "the example's output lacks {expected:?}");
    }
    let png = std::fs::read(scratch.path().join("plot.png")).expect("the example saved plot.png");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "plot.png is not a PNG");
    record_printed_id(&run, &ids_file);
    assert_nothing_left(server, &ids_file, 1);
}

/// The `e2b` npm package, unmodified: create, streamed commands.run, an exit-code error, files write/read/list, a
/// missing file, kill (tests/e2b-node/smoke.cjs).
#[test]
fn e2b_node_sdk_smoke() {
    require_root!();
    let modules = node_modules();
    let server = start_server();
    let scratch = tempfile::tempdir().expect("tempdir");
    let ids_file = scratch.path().join("sandbox-ids");
    let script = common::venvs::repo_root().join("tests/e2b-node/smoke.cjs");
    let node = Path::new("/usr/bin/node");
    let args = [script.to_str().expect("utf-8 path")];
    let run = run_client(&server, node, &args, scratch.path(), &ids_file, &[("NODE_PATH", &modules)]);
    assert!(run.success, "tests/e2b-node/smoke.cjs failed (its output is above)");
    assert!(run.output.contains("e2b node smoke: ok"), "the smoke test did not finish");
    record_printed_id(&run, &ids_file);
    assert_nothing_left(&server, &ids_file, 1);
}

/// The core calls of the `e2b` and `@e2b/code-interpreter` npm packages, unmodified, as node:test tests: create,
/// commands streamed to callbacks while they run, background commands, stdin and kill, files write/read/list, runCode
/// (Python and JavaScript), a PTY (create, input, output, resize, kill) and kill (tests/e2b-node/core.test.cjs).
#[test]
fn e2b_node_sdk_core_calls() {
    require_root!();
    let modules = node_modules();
    let server = start_server();
    let scratch = tempfile::tempdir().expect("tempdir");
    let ids_file = scratch.path().join("sandbox-ids");
    let script = common::venvs::repo_root().join("tests/e2b-node/core.test.cjs");
    let node = Path::new("/usr/bin/node");
    let args = [script.to_str().expect("utf-8 path")];
    let run = run_client(&server, node, &args, scratch.path(), &ids_file, &[("NODE_PATH", &modules)]);
    assert!(run.success, "tests/e2b-node/core.test.cjs failed (its output is above)");
    assert!(run.output.contains("# pass 7\n") && run.output.contains("# fail 0\n"), "not every node test passed");
    // The tests record every sandbox they create (three).
    assert_nothing_left(&server, &ids_file, 3);
}

/// target/e2b-node/node_modules, holding the pinned npm packages (or a failure naming the setup script).
fn node_modules() -> PathBuf {
    let modules = common::venvs::repo_root().join("target/e2b-node/node_modules");
    for package in ["e2b", "@e2b/code-interpreter"] {
        assert!(
            modules.join(package).join("package.json").exists(),
            "{} lacks the {package} package: run scripts/setup-e2b.sh (scripts/setup.sh and CI run it)",
            modules.display()
        );
    }
    modules
}
