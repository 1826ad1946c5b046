//! The behaviour suites run per isolation tier, and a suite cannot silently forget one.
//!
//! The rules, checked on the suites' source text:
//! - `per_tier!` (tests/common/mod.rs) expands into exactly the tiers of `Tier::AVAILABLE`.
//! - Every behaviour suite (a file named `run_*`, `serve_*`, `attacks_*` or `client_*`) is in `PER_TIER_SUITES` or,
//!   with a reason, in `NOT_PER_TIER`; files whose name says `gvisor` or `microvm` are that tier's own suites.
//! - In a per-tier suite, tests are functions `fn name(tier: Tier)` listed in `per_tier!`, which writes their
//!   `#[test]`s. So every `#[test]` written in such a file is a single-tier test, and needs an entry in `SINGLE_TIER`
//!   saying why it runs on one tier only (every entry must still name such a test).
//! - A per-tier suite does not call the helpers that pick a tier for it (`run`, `run_code`, `Server::start`, …): it
//!   passes one (`run_on(tier, …)`, `Server::start_on(tier)`, …), so a test cannot end up on the default tier by
//!   forgetting to pass the one it was given. A single-tier test names its tier (`run_on(Tier::Process, …)`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use std::path::Path;

use common::Tier;

per_tier!(each_variant_runs_its_sandbox_on_its_own_tier);

/// The macro and `run_on` really hand each variant its tier: the process tier shares the host's kernel, gVisor's
/// Sentry and the microVM's guest kernel are kernels of their own.
fn each_variant_runs_its_sandbox_on_its_own_tier(tier: Tier) {
    let host = std::fs::read_to_string("/proc/version").unwrap();
    let r = common::run_on(tier, ["--", "cat", "/proc/version"]).json();
    r.assert_exit(0);
    match tier {
        Tier::Process => assert_eq!(r.stdout(), host, "{}", r.describe()),
        _ => assert_ne!(r.stdout(), host, "the {tier} sandbox runs on the host's kernel\n{}", r.describe()),
    }
    common::assert_gone(tier, &r.id());
}

/// The suites whose tests run per tier.
const PER_TIER_SUITES: &[&str] = &[
    "run_behaviour.rs",
    "run_limits.rs",
    "run_languages.rs",
    "serve_api.rs",
    "serve_metrics.rs",
    "serve_code.rs",
    "serve_background.rs",
    "serve_pty.rs",
    "serve_ports.rs",
    "serve_results.rs",
    "serve_templates.rs",
    "serve_output_bounds.rs",
    "serve_pause.rs",
    "serve_pause_files.rs",
    "serve_snapshots.rs",
    "attacks_host_files.rs",
    "serve_archive.rs",
    "serve_egress.rs",
    "serve_egress_descriptors.rs",
    "client_cli.rs",
    "client_shell.rs",
    "attacks_agent.rs",
    "attacks_sudo.rs",
    "attacks_fs.rs",
    "attacks_network.rs",
    "attacks_owner.rs",
    "attacks_processes.rs",
    "attacks_quotas.rs",
    "attacks_sandbox_root.rs",
    "attacks_syscalls.rs",
];

/// Behaviour suites (by file name) that are not per tier, and why.
const NOT_PER_TIER: &[(&str, &str)] = &[
    (
        "templates.rs",
        "one build per test, run on each tier by the test itself (process, then gVisor and microVM where they run)",
    ),
    (
        "serve_template_build.rs",
        "template builds run in process-tier build sandboxes whatever the server's tiers; a built template on every \
         tier is serve_templates.rs's per-tier test",
    ),
    ("serve_connections.rs", "the HTTP server's connection limits hold before any sandbox exists: no tier is involved"),
    (
        "serve_crash.rs",
        "not per tier yet: the server's crash and restart with gVisor sandboxes is the issue's own leak item",
    ),
    ("serve_pool.rs", "not per tier yet: warm pools of gVisor sandboxes (and zygotes in them) are their own item"),
    ("serve_run_cli.rs", "not per tier yet: it compares run --server with the local path through a (zygote) pool"),
    (
        "serve_scan.rs",
        "the static scan refuses in the server before the runtime is asked for anything (no tier is involved); the \
         sandbox its exec test keeps using is the default tier's",
    ),
];

/// Tests of per-tier suites that run on one tier only: (file, test, why).
const SINGLE_TIER: &[(&str, &str, &str)] = &[(
    "attacks_processes.rs",
    "sandbox_processes_run_as_unprivileged_host_uid",
    "the process tier's host uid mapping (inside uid 1000 is host uid 1 000 001 000); gVisor's guest processes are \
     no host processes at all (gvisor_run.rs shows that)",
)];

/// Calls that pick a tier without being told one, and what a per-tier suite calls instead. An entry starting with a
/// letter is a function of `common`: it matches bare or as `common::…`, not after another identifier character, `.`,
/// path or `fn ` (`run(` is not `server.run(`, `fn run(` or `Self::run(`).
const UNTIERED: &[(&str, &str)] = &[
    ("run(", "run_on(tier, …)"),
    ("run_code(", "code_on(tier, …)"),
    ("gvisor_run(", "run_on(tier, …)"),
    ("gvisor_code(", "code_on(tier, …)"),
    ("assert_no_leaks(", "assert_gone(tier, …)"),
    ("assert_no_gvisor_leaks(", "assert_gone(tier, …)"),
    ("assert_sandbox_gone(", "assert_sandbox_gone_on(tier, …)"),
    ("Server::start(", "Server::start_on(tier)"),
    ("Server::start_with(", "Server::start_with_on(tier, …)"),
    ("World::start(", "World::start_on(tier, …)"),
    (".create(", ".create_on(tier, …)"),
    (".sandbox(", ".sandbox_on(tier, …)"),
];

fn tests_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests"))
}

fn source(file: &str) -> String {
    std::fs::read_to_string(tests_dir().join(file)).unwrap_or_else(|e| panic!("read tests/{file}: {e}"))
}

/// The names of the functions carrying a `#[test]` written in `text`.
fn written_tests(text: &str) -> Vec<String> {
    let mut tests = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "#[test]" {
            continue;
        }
        let name = lines.by_ref().find_map(|l| {
            let at = l.find("fn ")?;
            let rest = &l[at + 3..];
            Some(rest[..rest.find('(').unwrap_or(rest.len())].trim().to_owned())
        });
        tests.push(name.unwrap_or_else(|| "<a #[test] without a fn>".to_owned()));
    }
    tests
}

/// Where `text` calls `call` (line numbers, 1-based), by the rule of `UNTIERED`.
fn calls_of(text: &str, call: &str) -> Vec<usize> {
    let bare = call.starts_with(|c: char| c.is_ascii_alphabetic());
    let mut found = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or_default();
        let hit = code.match_indices(call).any(|(at, _)| {
            let before = &code[..at];
            let other = before.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.')
                || before.ends_with("fn ")
                || (before.ends_with(':') && !before.ends_with("common::"));
            !bare || !other
        });
        if hit {
            found.push(index + 1);
        }
    }
    found
}

#[test]
fn per_tier_expands_into_exactly_the_available_tiers() {
    assert_eq!(
        [process::TIER, gvisor::TIER, microvm::TIER].as_slice(),
        Tier::AVAILABLE.as_slice(),
        "per_tier! (tests/common/mod.rs) must expand into one module per tier of Tier::AVAILABLE, in its order: add \
         an `@tier` line for the new tier there, and its module here"
    );
    for tier in Tier::AVAILABLE {
        assert!(tier.unavailable_reason().is_none(), "{tier} is in Tier::AVAILABLE but says it is not available");
    }
}

#[test]
fn every_behaviour_suite_is_per_tier_or_says_why_not() {
    let mut unclassified = Vec::new();
    for entry in std::fs::read_dir(tests_dir()).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let suite = ["run_", "serve_", "attacks_", "client_"].iter().any(|p| name.starts_with(p));
        if !suite || !name.ends_with(".rs") || name.contains("gvisor") || name.contains("microvm") {
            continue;
        }
        if !PER_TIER_SUITES.contains(&name.as_str()) && !NOT_PER_TIER.iter().any(|(file, _)| *file == name) {
            unclassified.push(name);
        }
    }
    unclassified.sort();
    assert!(
        unclassified.is_empty(),
        "behaviour suites neither in PER_TIER_SUITES nor (with a reason) in NOT_PER_TIER: {unclassified:?}"
    );
    for file in PER_TIER_SUITES.iter().chain(NOT_PER_TIER.iter().map(|(file, _)| file)) {
        assert!(tests_dir().join(file).is_file(), "tests/{file} is listed here but does not exist");
    }
}

#[test]
fn per_tier_suites_have_no_unexplained_single_tier_test() {
    let mut problems = Vec::new();
    for file in PER_TIER_SUITES {
        let text = source(file);
        if !text.contains("per_tier!(") {
            problems.push(format!("{file}: no per_tier! invocation"));
        }
        let written = written_tests(&text);
        for test in &written {
            if !SINGLE_TIER.iter().any(|(f, t, _)| f == file && t == test) {
                problems.push(format!(
                    "{file}: #[test] {test} runs on one tier only: make it `fn {test}(tier: Tier)` and list it in \
                     per_tier!, or add it to SINGLE_TIER with the reason"
                ));
            }
        }
        for (untiered, instead) in UNTIERED {
            for line in calls_of(&text, untiered) {
                problems.push(format!("{file}:{line}: calls {untiered}…) without a tier: use {instead}"));
            }
        }
    }
    for (file, test, why) in SINGLE_TIER {
        assert!(!why.trim().is_empty(), "SINGLE_TIER entry {file} {test} gives no reason");
        if !PER_TIER_SUITES.contains(file) || !written_tests(&source(file)).contains(&(*test).to_owned()) {
            problems.push(format!("SINGLE_TIER names {file} {test}, which is no #[test] of a per-tier suite"));
        }
    }
    assert!(problems.is_empty(), "per-tier coverage:\n  {}", problems.join("\n  "));
}
