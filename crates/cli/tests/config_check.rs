//! `sandkasten config check FILE`: a file with several problems at once (a misspelt key, a wrong type, an unknown
//! tier, a pool with min > max, a duplicate API key, a bad CIDR) gets every one reported with its key path, line and
//! column, and exit 2 (`--json` too); a valid file exits 0 with a summary; the example config and every server config
//! embedded in the docs pass; and `sandkasten serve` refuses the same bad file with the same messages.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(unused_macros)] // `require_root!`: nothing here needs root
mod common;

use std::path::{Path, PathBuf};

use common::Cli;

const KEY: &str = "0123456789abcdef-config-check";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn write(dir: &tempfile::TempDir, text: &str) -> String {
    let path = dir.path().join("sandkasten.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

fn check(file: &str, json: bool) -> common::Output {
    let mut args = vec!["config", "check", file];
    if json {
        args.push("--json");
    }
    // No keys from the environment: only the file's.
    Cli::new(args).env("SANDKASTEN_API_KEYS", "").output_unlocked()
}

fn bad_file() -> String {
    format!(
        "lisen = \"127.0.0.1:8080\"\n\
         max_timeout_s = \"a day\"\n\
         [[tenants]]\nname = \"a\"\napi_keys = [\"{KEY}\"]\n\
         [[tenants]]\nname = \"b\"\napi_keys = [\"{KEY}\"]\n\
         [[pools]]\nisolation = \"gvisr\"\n\
         [[pools]]\nname = \"big\"\nlimits = {{ pids = 16 }}\nmin = 9\nmax = 2\n\
         [egress]\nallow_cidrs = [\"10.0.0.0/33\"]\n"
    )
}

#[test]
fn every_problem_of_a_file_is_reported_with_its_path_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(&dir, &bad_file());
    let out = check(&file, false);
    assert_eq!(out.code, 2, "{}", out.describe());
    let lines: Vec<String> = out.stdout_text().lines().map(str::to_owned).collect();
    let expected = [
        format!("{file}:1:1: lisen: unknown key; did you mean \"listen\"?"),
        format!("{file}:2:17: max_timeout_s: expected an integer, found a string"),
        format!(
            "{file}:8:13: tenants[1].api_keys[0]: this API key (not shown) is configured more than once: also at \
             tenants[0].api_keys[0]"
        ),
        format!(
            "{file}:10:13: pools[0].isolation: unknown tier \"gvisr\"; expected one of process, gvisor, microvm, auto \
             (did you mean \"gvisor\"?)"
        ),
        format!("{file}:14:1: pools[1].min: must be 1 to max (2), got 9"),
        format!(
            "{file}:17:16: egress.allow_cidrs[0]: invalid CIDR \"10.0.0.0/33\": write an address with a prefix \
             length, e.g. \"10.200.1.0/24\""
        ),
    ];
    assert_eq!(lines, expected, "{}", out.describe());
    assert!(out.stderr_text().contains("6 problems"), "{}", out.describe());
    assert!(!out.stdout_text().contains(KEY) && !out.stderr_text().contains(KEY), "a key is shown");

    let out = check(&file, true);
    assert_eq!(out.code, 2, "{}", out.describe());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["ok"], false);
    let problems = json["problems"].as_array().unwrap();
    let paths: Vec<&str> = problems.iter().map(|p| p["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        [
            "lisen",
            "max_timeout_s",
            "tenants[1].api_keys[0]",
            "pools[0].isolation",
            "pools[1].min",
            "egress.allow_cidrs[0]"
        ]
    );
    assert_eq!((problems[3]["line"].as_u64(), problems[3]["column"].as_u64()), (Some(10), Some(13)));
}

#[test]
fn serve_refuses_the_same_file_with_the_same_messages() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(&dir, &bad_file());
    let checked = check(&file, false).stdout_text();
    let database = dir.path().join("db.sqlite").display().to_string();
    let out = Cli::new(["serve", "--config", &file, "--database", &database])
        .env("SANDKASTEN_API_KEYS", "")
        .output_unlocked();
    assert_eq!(out.code, 2, "{}", out.describe());
    let stderr = out.stderr_text();
    for line in checked.lines() {
        assert!(stderr.contains(line), "serve did not say {line:?}:\n{stderr}");
    }
    assert!(!Path::new(&database).exists(), "serve created its database before refusing the config");
}

#[test]
fn a_valid_file_exits_0_with_a_summary() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[[tenants]]\nname = \"a\"\napi_keys = [\"{KEY}\"]\nadmin = true\n[[pools]]\nmin = 1\n[scan]\nmode = \"warn\"\n"
    );
    let file = write(&dir, &text);
    let out = check(&file, false);
    assert_eq!(out.code, 0, "{}", out.describe());
    let stdout = out.stdout_text();
    assert!(stdout.starts_with(&format!("ok: {file}: listen 127.0.0.1:8080;")), "{stdout}");
    assert!(stdout.contains("1 tenant (1 admin) with 1 API key; 1 warm pool;"), "{stdout}");
    assert!(stdout.contains("scan warn"), "{stdout}");
    let out = check(&file, true);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((json["ok"].as_bool(), out.code), (Some(true), 0), "{}", out.describe());
}

#[test]
fn an_unreadable_or_malformed_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.toml").display().to_string();
    let out = check(&missing, false);
    assert_eq!(out.code, 2, "{}", out.describe());
    assert!(out.stderr_text().contains("cannot read config file"), "{}", out.describe());
    let file = write(&dir, "[tenants\nname = \n");
    let out = check(&file, false);
    assert_eq!(out.code, 2, "{}", out.describe());
    assert!(out.stdout_text().contains(&format!("{file}:1:")), "{}", out.describe());
    assert!(out.stdout_text().contains("invalid TOML"), "{}", out.describe());
}

/// The server configs the docs show: the example file whole, and each ```toml block of README.md and docs/*.md that
/// is a server config (scan policy files are checked by `scan_cli`), with a key from the environment for fragments.
#[test]
fn the_example_config_and_the_configs_in_the_docs_pass() {
    let out = check(&repo().join("examples/sandkasten.toml").display().to_string(), false);
    assert_eq!(out.code, 0, "{}", out.describe());
    let dir = tempfile::tempdir().unwrap();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.push(repo().join("README.md"));
    let mut blocks = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if line.trim() == "```toml" {
                let block: Vec<&str> = lines.by_ref().take_while(|line| line.trim() != "```").collect();
                blocks.push((doc.clone(), block.iter().map(|line| line.trim_start()).collect::<Vec<_>>().join("\n")));
            }
        }
    }
    let module_doc = std::fs::read_to_string(repo().join("crates/server/src/config.rs")).unwrap();
    let example: Vec<&str> = module_doc
        .lines()
        .skip_while(|line| *line != "//! ```toml")
        .skip(1)
        .take_while(|line| *line != "//! ```")
        .map(|line| line.strip_prefix("//!").unwrap_or(line).strip_prefix(' ').unwrap_or(""))
        .collect();
    assert!(example.len() > 20, "the config example in config.rs's doc comment is gone");
    blocks.push((PathBuf::from("crates/server/src/config.rs"), example.join("\n")));
    let mut checked = 0;
    for (doc, block) in blocks {
        if block.contains("# policy.toml") {
            continue;
        }
        let file = write(&dir, &block);
        let out = Cli::new(["config", "check", &file])
            .env("SANDKASTEN_API_KEYS", &format!("docs-tenant:{KEY}"))
            .output_unlocked();
        assert_eq!(out.code, 0, "the config in {} does not pass:\n{block}\n{}", doc.display(), out.describe());
        checked += 1;
    }
    assert!(checked >= 4, "only {checked} configs found in the docs");
}
