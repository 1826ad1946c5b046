//! `sandkasten run --server URL`: the one-shot CLI sent to a running server takes a warm pool's sandbox (and its
//! zygote), and prints and exits exactly as the local path does for the same arguments.

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use common::{Cli, Output};
use serve::{KEY_1, Server, metric};

/// A pool of the CLI's default limits with a Python zygote.
const POOL: &str = "[[pools]]\nname = \"std\"\nmin = 2\nmax = 4\nzygote = \"python\"\n";

fn cli(args: &[&str], stdin: Option<&str>) -> Cli {
    let mut all = vec!["run"];
    all.extend_from_slice(args);
    let cli = Cli::new(all).env("SANDKASTEN_API_KEY", KEY_1);
    match stdin {
        Some(text) => cli.stdin(text),
        None => cli,
    }
}

/// The same run locally and through the server (`--server`).
fn both(server: &Server, args: &[&str], stdin: Option<&str>) -> (Output, Output) {
    let local = cli(args, stdin).output_unlocked();
    let mut remote_args = vec!["--server", server.url.as_str()];
    remote_args.extend_from_slice(args);
    let remote = cli(&remote_args, stdin).output_unlocked();
    (local, remote)
}

#[test]
fn run_with_a_server_uses_its_pool_and_zygote() {
    require_root!();
    let _lock = common::shared_lock();
    let server = Server::start_with(POOL);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while metric(&server, "sandkasten_pool_size{class=\"std\"}") < 2.0 {
        assert!(std::time::Instant::now() < deadline, "the pool did not fill");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (hits, forks) =
        (metric(&server, "sandkasten_pool_hits_total"), metric(&server, "sandkasten_zygote_runs_total"));
    let out = Cli::new(["run", "--lang", "python", "--code", "print(2+2)"])
        .env("SANDKASTEN_SERVER", &server.url)
        .env("SANDKASTEN_API_KEY", KEY_1)
        .output_unlocked();
    assert_eq!((out.code, out.stdout_text().as_str()), (0, "4\n"), "{}", out.describe());
    assert!(metric(&server, "sandkasten_pool_hits_total") > hits, "the run took a pool sandbox");
    assert!(metric(&server, "sandkasten_zygote_runs_total") > forks, "the run forked from the zygote");
}

#[test]
fn run_with_a_server_prints_and_exits_as_the_local_path() {
    require_root!();
    let _lock = common::shared_lock();
    let server = Server::start_with(POOL);
    let cases: &[(&[&str], Option<&str>, i32)] = &[
        (&["--lang", "python", "--code", "print(2+2)"], None, 0),
        (&["--lang", "bash", "--code", "echo out; echo err >&2; exit 3"], None, 3),
        (&["--lang", "node", "--code", "console.log([1,2].map(x => x * 2))"], None, 0),
        (&["--lang", "python", "--code", "print(input()[::-1])"], Some("olleh\n"), 0),
        (&["--lang", "python", "--code", "import os; os.kill(os.getpid(), 9)"], None, 137),
        (&["--lang", "c", "--code", "int main(void) { return 4; }"], None, 4),
        (&["--lang", "c", "--code", "int main(void) { return }"], None, 123),
        (&["--timeout", "1s", "--lang", "python", "--code", "print('start', flush=True)\nwhile True: pass"], None, 124),
        (&["--output-limit", "1KiB", "--lang", "python", "--code", "print('x' * 5000)"], None, 121),
        (&["--", "sh", "-c", "echo $0; exit 7"], None, 7),
        (&["--env", "GREETING=hi", "--", "sh", "-c", "echo $GREETING"], None, 0),
    ];
    let finished = "sandkasten_sandbox_exits_total{reason=\"run_finished\"}";
    let runs_before = metric(&server, finished);
    for (args, stdin, code) in cases {
        let (local, remote) = both(&server, args, *stdin);
        let what = format!("{args:?}\nlocal: {}\nremote: {}", local.describe(), remote.describe());
        assert_eq!((local.code, remote.code), (*code, *code), "{what}");
        if *code == 121 {
            // Both cut at the limit; the local path kills at the first byte past it, the server's sandbox may have
            // written more before it was stopped: the kept bytes are the same.
            assert_eq!(local.stdout.len(), remote.stdout.len(), "{what}");
        } else {
            assert_eq!(local.stdout_text(), remote.stdout_text(), "{what}");
        }
        if *code == 123 {
            assert!(remote.stderr_text().contains("error"), "{what}");
        } else {
            // The program's stderr and sandkasten's notes (e.g. "timed out after 1s; the sandbox was killed").
            assert_eq!(local.stderr_text(), remote.stderr_text(), "{what}");
        }
    }
    // --json: the local path's object, with the same output and exit status.
    let (local, remote) =
        both(&server, &["--json", "--lang", "python", "--code", "import sys; print(1); sys.exit(5)"], None);
    let (local, remote) = (common::RunResult::parse(local), common::RunResult::parse(remote));
    assert_eq!((local.exit_code(), remote.exit_code()), (Some(5), Some(5)), "{}", remote.describe());
    assert_eq!((local.stdout(), remote.stdout()), ("1\n".to_owned(), "1\n".to_owned()));
    assert_eq!((local.output.code, remote.output.code), (5, 5));
    let (local_keys, remote_keys): (Vec<String>, Vec<String>) = (
        local.json.as_object().unwrap().keys().cloned().collect(),
        remote.json.as_object().unwrap().keys().cloned().collect(),
    );
    assert_eq!(local_keys, remote_keys);
    // The remote run's phases come from the server, from its request on, in order.
    let phase = |name: &str| remote.json["phases"][name].as_f64().unwrap_or(-1.0);
    let order = ["allocate", "filesystem_ready", "runtime_ready", "first_command"].map(phase);
    assert!(order.windows(2).all(|w| w[0] <= w[1]) && order[0] >= 0.0 && order[3] > 0.0, "{}", remote.describe());
    // Every remote run went through the server (the local path leaves no trace there).
    assert_eq!(metric(&server, finished) - runs_before, cases.len() as f64 + 1.0);
}

#[test]
fn run_with_a_server_reports_refusals_and_an_unreachable_server() {
    require_root!();
    let _lock = common::shared_lock();
    let server = Server::start();
    let refused = Cli::new(["run", "--server", &server.url, "--lang", "python", "--code", "1"])
        .env("SANDKASTEN_API_KEY", "not-a-key-of-this-server-000")
        .output_unlocked();
    assert_eq!(refused.code, 2, "{}", refused.describe());
    assert!(refused.stderr_text().contains("SANDKASTEN_API_KEY"), "{}", refused.describe());
    let gone = Cli::new(["run", "--server", "http://127.0.0.1:9", "--lang", "python", "--code", "1"]).output_unlocked();
    assert_eq!(gone.code, 125, "{}", gone.describe());
    assert!(gone.stderr_text().contains("http://127.0.0.1:9"), "{}", gone.describe());
}

/// `--isolation auto` decides by the same `[isolation.auto]` rules locally (default rules, `--trust`, this host's
/// tiers) and on a server (its rules, the tenant's trust): the same workload gets the same tier for the same reason,
/// printed and in `--json`; `--workload` reaches the server.
#[test]
fn run_isolation_auto_decides_locally_as_the_server_does() {
    require_root!();
    let _lock = common::shared_lock();
    let server = Server::start();
    let json = |out: &Output| -> serde_json::Value {
        serde_json::from_str(&out.stdout_text()).unwrap_or_else(|_| panic!("{}", out.describe()))
    };

    let internal = cli(&["--isolation", "auto", "--trust", "internal", "--json", "--", "true"], None).output_unlocked();
    let result = json(&internal);
    assert_eq!(result["isolation"]["tier"], "process", "{}", internal.describe());
    assert_eq!(
        result["isolation"]["reason"],
        "auto: rule 5 (internal tenant) chose process",
        "{}",
        internal.describe()
    );

    let plain = cli(&["--isolation", "auto", "--trust", "internal", "--", "true"], None).output_unlocked();
    assert_eq!(plain.code, 0, "{}", plain.describe());
    assert!(
        plain.stderr_text().contains("sandkasten: isolation process: auto: rule 5 (internal tenant) chose process"),
        "the choice is printed: {}",
        plain.describe()
    );

    // Untrusted (the default trust of a local run and of the server's tenants), needing a full Linux: microvm first,
    // skipped because its guests run under emulation here, so gvisor; the same on both sides.
    let args = ["--isolation", "auto", "--workload", "needs=linux", "--json", "--", "true"];
    let (local, remote) = both(&server, &args, None);
    let (local_result, remote_result) = (json(&local), json(&remote));
    assert_eq!(local_result["isolation"], remote_result["isolation"], "{}\n{}", local.describe(), remote.describe());
    let reason = local_result["isolation"]["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("auto: rule 3 (untrusted tenant, needs linux) chose gvisor"), "{reason}");
    assert!(reason.contains("microvm skipped: guests run under software emulation"), "{reason}");
    assert_eq!(local_result["isolation"]["tier"], "gvisor");

    // A kernel of its own needs a microVM, which auto does not pick under emulation: refused before anything runs.
    let refused = cli(&["--isolation", "auto", "--workload", "needs_kernel", "--", "true"], None).output_unlocked();
    assert_eq!(refused.code, 2, "bad input: {}", refused.describe());
    assert!(refused.stderr_text().contains("rule 1 (needs its own kernel) allows microvm"), "{}", refused.describe());
    let bad = cli(&["--isolation", "auto", "--workload", "kernel=yes", "--", "true"], None).output_unlocked();
    assert!(bad.stderr_text().contains("needs_kernel"), "a wrong workload names the fields: {}", bad.describe());
    let remote_trust =
        cli(&["--server", server.url.as_str(), "--trust", "internal", "--", "true"], None).output_unlocked();
    assert!(remote_trust.stderr_text().contains("--trust is for a local run"), "{}", remote_trust.describe());
}
