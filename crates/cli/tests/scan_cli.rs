//! The static scan from the CLI: `sandkasten run --policy FILE` refuses in `enforce` with exit 2 and the findings
//! before anything runs (as JSON with `--json`), runs in `warn` with the findings on stderr; `sandkasten scan FILE`
//! scans offline.

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use common::Cli;

fn policy(dir: &tempfile::TempDir, text: &str) -> String {
    let path = dir.path().join("policy.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn run_policy_enforce_refuses_with_exit_2_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let policy = policy(&dir, "mode = \"enforce\"\n");
    // Were it run, the print would reach stdout: nothing does.
    let code = "import os\nos.system('rm -rf /')\nprint('ran')\n";
    let out = Cli::new(["run", "--policy", &policy, "--lang", "python", "--code", code]).output();
    assert_eq!(out.code, 2, "{}", out.describe());
    assert!(out.stdout.is_empty(), "{}", out.describe());
    let stderr = out.stderr_text();
    assert!(stderr.contains("2:1 critical destructive_command"), "{stderr}");
    assert!(stderr.contains("nothing was run"), "{stderr}");
    let out = Cli::new(["run", "--policy", &policy, "--json", "--lang", "bash", "--code", ":(){ :|:& };:"]).output();
    assert_eq!(out.code, 2, "{}", out.describe());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["error"]["code"], "scan_refused");
    assert_eq!(json["error"]["findings"][0]["rule"], "fork_bomb");
    // A program after `--` is scanned as a bash command line.
    let out = Cli::new(["run", "--policy", &policy, "--", "rm", "-rf", "/"]).output();
    assert_eq!(out.code, 2, "{}", out.describe());
}

#[test]
fn run_policy_warn_runs_and_prints_the_findings_to_stderr() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let policy = policy(&dir, "mode = \"warn\"\n");
    let code = "x = 'print(7)'\nexec(x)\n";
    let out = Cli::new(["run", "--policy", &policy, "--lang", "python", "--code", code]).output();
    assert_eq!(out.code, 0, "{}", out.describe());
    assert_eq!(out.stdout_text(), "7\n");
    assert!(out.stderr_text().contains("2:1 high dynamic_eval"), "{}", out.describe());
}

#[test]
fn run_policy_import_allowlist_is_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let policy = policy(&dir, "mode = \"enforce\"\n[python]\nallow_imports = [\"json\", \"math\"]\n");
    let out =
        Cli::new(["run", "--policy", &policy, "--lang", "python", "--code", "import json\nimport socket\n"]).output();
    assert_eq!(out.code, 2, "{}", out.describe());
    assert!(out.stderr_text().contains("2:1 high import_not_allowed"), "{}", out.describe());
}

#[test]
fn a_bad_policy_file_is_exit_2_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let policy = policy(&dir, "mode = \"strict\"\n");
    let out = Cli::new(["run", "--policy", &policy, "--", "true"]).output();
    assert_eq!(out.code, 2, "{}", out.describe());
    assert!(out.stderr_text().contains("policy") && out.stderr_text().contains("strict"), "{}", out.describe());
}

#[test]
fn scan_reports_findings_offline_and_exits_2_on_block() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("main.py");
    std::fs::write(&file, "import base64\nexec(base64.b64decode('cHJpbnQoMSk='))\n").unwrap();
    let file = file.display().to_string();
    let out = Cli::new(["scan", &file, "--json"]).output_unlocked();
    assert_eq!(out.code, 0, "{}", out.describe());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["verdict"], "warn");
    assert_eq!(json["findings"][0]["rule"], "obfuscated_exec");
    assert_eq!(json["findings"][0]["line"], 2);
    let policy = policy(&dir, "mode = \"enforce\"\n");
    let out = Cli::new(["scan", &file, "--policy", &policy]).output_unlocked();
    assert_eq!(out.code, 2, "{}", out.describe());
    assert!(out.stdout_text().contains("verdict: block"), "{}", out.describe());
    let out = Cli::new(["scan", "-", "--language", "javascript"]).stdin("console.log(1)\n").output_unlocked();
    assert_eq!((out.code, out.stdout_text()), (0, "verdict: allow\n".to_owned()), "{}", out.describe());
}
