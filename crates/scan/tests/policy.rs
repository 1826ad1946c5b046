//! Import validation against a policy (allowlist, denylist, module prefixes, `node:`), the verdict per mode and
//! blocking severities, and overrides that may only tighten a policy.

use sandkasten_scan::{Mode, ScanLanguage, ScanPolicy, ScanPolicyOverride, Severity, Verdict, scan};

fn policy(text: &str) -> ScanPolicy {
    ScanPolicy::from_toml_str(text).unwrap_or_else(|e| panic!("{e}"))
}

fn rules(policy: &ScanPolicy, language: ScanLanguage, code: &str) -> Vec<(String, u32)> {
    let report = scan(language, code, policy).unwrap_or_else(|e| panic!("{e}"));
    report.findings.into_iter().map(|f| (f.rule, f.line)).collect()
}

#[test]
fn allowlist_flags_every_other_import_and_matches_submodules() {
    let policy = policy("mode = \"enforce\"\n[python]\nallow_imports = [\"numpy\", \"os\", \"json\"]\n");
    let code = "import numpy.linalg\nimport os.path\nfrom json import loads\nimport requests\nfrom urllib import request\nfrom . import local\n";
    let found = rules(&policy, ScanLanguage::Python, code);
    assert_eq!(found, [("import_not_allowed".to_owned(), 4), ("import_not_allowed".to_owned(), 5)]);
}

#[test]
fn a_prefix_is_not_a_module() {
    // `osx` is not under `os`.
    let policy = policy("mode = \"enforce\"\n[python]\nallow_imports = [\"os\"]\n");
    assert_eq!(rules(&policy, ScanLanguage::Python, "import osx\n"), [("import_not_allowed".to_owned(), 1)]);
}

#[test]
fn denylist_wins_over_allowlist_and_matches_node_prefix() {
    let policy = policy(
        "mode = \"enforce\"\n[javascript]\nallow_imports = [\"fs\", \"child_process\"]\ndeny_imports = [\"child_process\"]\n",
    );
    let code =
        "const fs = require('node:fs/promises');\nconst cp = require('node:child_process');\nimport x from 'lodash';\n";
    let found = rules(&policy, ScanLanguage::Javascript, code);
    assert!(found.contains(&("import_denied".to_owned(), 2)), "{found:?}");
    assert!(found.contains(&("import_not_allowed".to_owned(), 3)), "{found:?}");
    assert!(!found.iter().any(|(_, line)| *line == 1), "{found:?}");
}

#[test]
fn a_dynamic_import_under_an_allowlist_blocks() {
    let policy = policy("mode = \"enforce\"\n[python]\nallow_imports = [\"json\"]\n");
    let report = scan(ScanLanguage::Python, "m = __import__(name)\n", &policy).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.findings[0].rule, "dynamic_import");
    assert_eq!(report.findings[0].severity, Severity::High);
    assert_eq!(report.verdict, Verdict::Block);
}

#[test]
fn verdict_follows_mode_and_blocking_severities() {
    let code = "import subprocess\nsubprocess.run(['ls'])\n";
    let verdict = |text: &str| scan(ScanLanguage::Python, code, &policy(text)).map(|r| r.verdict).ok();
    // process_exec is medium: not blocking by default.
    assert_eq!(verdict("mode = \"enforce\""), Some(Verdict::Warn));
    assert_eq!(verdict("mode = \"enforce\"\nblock = [\"medium\", \"high\", \"critical\"]"), Some(Verdict::Block));
    assert_eq!(verdict("mode = \"warn\"\nblock = [\"medium\"]"), Some(Verdict::Warn));
    assert_eq!(verdict("mode = \"off\""), Some(Verdict::Allow));
    let clean = scan(ScanLanguage::Python, "print(1)\n", &policy("mode = \"enforce\"")).map(|r| r.verdict).ok();
    assert_eq!(clean, Some(Verdict::Allow));
}

#[test]
fn policy_files_are_checked() {
    assert!(ScanPolicy::from_toml_str("mode = \"strict\"").is_err());
    assert!(ScanPolicy::from_toml_str("mode = \"warn\"\nallow = []").is_err());
    assert!(ScanPolicy::from_toml_str("mode = \"warn\"\n[python]\ndeny_imports = [\"\"]").is_err());
    assert!(ScanPolicy::from_toml_str("block = [\"high\"]").is_err(), "mode is required");
}

fn tenant() -> ScanPolicy {
    policy("mode = \"warn\"\n[python]\nallow_imports = [\"numpy\", \"json\"]\ndeny_imports = [\"ctypes\"]\n")
}

fn change(json: &str) -> ScanPolicyOverride {
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn overrides_may_tighten() {
    let tightened = tenant().tightened(&change(
        r#"{"mode": "enforce", "block": ["medium", "high", "critical"],
            "python": {"allow_imports": ["numpy.linalg"], "deny_imports": ["pickle"]}}"#,
    ));
    let tightened = tightened.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(tightened.mode, Mode::Enforce);
    assert!(tightened.blocks(Severity::Medium));
    assert_eq!(tightened.python.allow_imports, Some(vec!["numpy.linalg".to_owned()]));
    assert_eq!(tightened.python.deny_imports, ["ctypes", "pickle"]);
}

#[test]
fn overrides_may_not_loosen_and_name_the_field() {
    let field = |json: &str| tenant().tightened(&change(json)).err().map(|e| e.field);
    assert_eq!(field(r#"{"mode": "off"}"#).as_deref(), Some("mode"));
    assert_eq!(field(r#"{"block": ["critical"]}"#).as_deref(), Some("block"));
    assert_eq!(
        field(r#"{"python": {"allow_imports": ["numpy", "requests"]}}"#).as_deref(),
        Some("python.allow_imports")
    );
    let error = tenant().tightened(&change(r#"{"python": {"allow_imports": ["requests"]}}"#)).err();
    assert!(error.is_some_and(|e| e.to_string().contains("requests")));
}

#[test]
fn code_the_scan_cannot_read_blocks_under_enforce_warns_under_warn_and_passes_off() {
    for (mode, verdict) in [("enforce", Verdict::Block), ("warn", Verdict::Warn), ("off", Verdict::Allow)] {
        let report = sandkasten_scan::unreadable("java", &policy(&format!("mode = \"{mode}\"")));
        assert_eq!(report.verdict, verdict, "{mode}");
        assert_eq!(report.findings.len(), 1);
        assert_eq!(report.findings[0].rule, "scan_incomplete");
        assert_eq!(report.findings[0].severity, Severity::High);
        assert!(report.findings[0].message.contains("cannot read java"), "{}", report.findings[0].message);
    }
}
