//! The scan's bounds: too much code is an error that says so, 1 MB of ordinary code is scanned completely (within
//! the default deadline, with much to spare), and pathological inputs end at the scan's own bounds with a
//! `scan_incomplete` finding instead of hanging.

use std::time::Duration;

use sandkasten_scan::{Bounds, Mode, ScanError, ScanLanguage, ScanPolicy, Verdict, scan, scan_with};

fn enforce() -> ScanPolicy {
    ScanPolicy { mode: Mode::Enforce, ..ScanPolicy::default() }
}

#[test]
fn code_above_the_maximum_is_refused_with_the_sizes() {
    let bounds = Bounds { max_code_bytes: 1000, ..Bounds::default() };
    let code = "x = 1\n".repeat(200);
    match scan_with(ScanLanguage::Python, &code, &enforce(), &bounds) {
        Err(error @ ScanError::TooLarge { bytes: 1200, max: 1000 }) => assert!(error.to_string().contains("1000")),
        other => panic!("expected TooLarge, got {other:?}"),
    }
}

/// About 1 MB of ordinary Python, with one hostile line at the end, so a complete scan is visible.
fn megabyte_of_python() -> String {
    let block = "def f{n}(values):\n    total = 0\n    for v in values:\n        total += v * {n}\n    \
                 return {{'n': {n}, 'total': total, 'items': [x for x in values if x % 2]}}\n\n";
    let mut code = String::from("import json\nimport math\n");
    let mut n = 0;
    while code.len() < 1_000_000 {
        code.push_str(&block.replace("{n}", &n.to_string()).replace("{{", "{").replace("}}", "}"));
        n += 1;
    }
    code.push_str("import os\nos.system('rm -rf /')\n");
    code
}

#[test]
fn a_megabyte_of_code_is_scanned_completely_within_the_default_deadline() {
    let code = megabyte_of_python();
    let report = scan(ScanLanguage::Python, &code, &enforce()).unwrap_or_else(|e| panic!("{e}"));
    assert!(!report.findings.iter().any(|f| f.rule == "scan_incomplete"), "{:?}", report.findings.first());
    let last_line = u32::try_from(code.lines().count()).unwrap_or(u32::MAX);
    assert!(report.findings.iter().any(|f| f.rule == "destructive_command" && f.line == last_line));
    assert_eq!(report.verdict, Verdict::Block);
}

/// Inputs built to be slow: deep nesting, one huge string, very many lines.
fn pathological() -> Vec<(ScanLanguage, String)> {
    vec![
        (ScanLanguage::Python, format!("x = {}1{}\n", "(".repeat(200_000), ")".repeat(200_000))),
        (ScanLanguage::Python, format!("x = {}\n", "[".repeat(400_000))),
        (ScanLanguage::Javascript, format!("let x = {}1{};\n", "[{a:".repeat(100_000), "}]".repeat(100_000))),
        (ScanLanguage::Bash, format!("echo {}\n", "$(".repeat(100_000))),
        (ScanLanguage::Bash, "a=1\n".repeat(1_000_000)),
    ]
}

#[test]
fn pathological_inputs_stop_at_a_tight_deadline_with_scan_incomplete() {
    let bounds = Bounds { deadline: Duration::from_millis(1), ..Bounds::default() };
    for (language, code) in pathological() {
        let report = scan_with(language, &code, &enforce(), &bounds).unwrap_or_else(|e| panic!("{e}"));
        let first = report.findings.first();
        assert_eq!(first.map(|f| f.rule.as_str()), Some("scan_incomplete"), "{language:?} {}: {first:?}", &code[..20]);
        assert!(first.is_some_and(|f| f.message.contains("deadline")), "{first:?}");
        // Fail closed: an incomplete scan blocks in enforce.
        assert_eq!(report.verdict, Verdict::Block);
    }
}

#[test]
fn pathological_inputs_end_under_the_default_bounds() {
    // Deep nesting must not overflow a stack (the walk is iterative) and every input answers: complete, or
    // incomplete at a named bound, which blocks in enforce (fail closed).
    for (language, code) in pathological() {
        let report = scan(language, &code, &enforce()).unwrap_or_else(|e| panic!("{e}"));
        if let Some(incomplete) = report.findings.iter().find(|f| f.rule == "scan_incomplete") {
            assert!(incomplete.message.contains("deadline") || incomplete.message.contains("nodes"), "{incomplete:?}");
            assert_eq!(report.verdict, Verdict::Block);
        }
    }
}

#[test]
fn a_huge_string_is_scanned_completely() {
    // One token is lexed in one step, so the parse deadline cannot cut it; its cost is bounded by max_code_bytes.
    let code = format!("s = '{}'\nimport os\nos.system('rm -rf /')\n", "a".repeat(3_000_000));
    let report = scan(ScanLanguage::Python, &code, &enforce()).unwrap_or_else(|e| panic!("{e}"));
    assert!(report.findings.iter().any(|f| f.rule == "destructive_command" && f.line == 3), "{:?}", report.findings);
}

#[test]
fn a_tree_larger_than_the_node_budget_is_incomplete() {
    let bounds = Bounds { max_nodes: 10_000, ..Bounds::default() };
    let code = "x = 1\n".repeat(10_000);
    let report = scan_with(ScanLanguage::Python, &code, &enforce(), &bounds).unwrap_or_else(|e| panic!("{e}"));
    let first = report.findings.first();
    assert!(first.is_some_and(|f| f.rule == "scan_incomplete" && f.message.contains("nodes")), "{first:?}");
}

#[test]
fn too_many_findings_is_incomplete() {
    let bounds = Bounds { max_findings: 10, ..Bounds::default() };
    let code = "eval(x)\n".repeat(100);
    let report = scan_with(ScanLanguage::Python, &code, &enforce(), &bounds).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.findings.len(), 11);
    assert!(report.findings[0].message.contains("maximum number of findings"));
}
