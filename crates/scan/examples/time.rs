//! Times scans of generated inputs (for choosing the bounds): `cargo run -p sandkasten-scan --example time`.
use sandkasten_scan::{Mode, ScanLanguage, ScanPolicy, scan};
fn main() {
    let policy = ScanPolicy { mode: Mode::Enforce, ..ScanPolicy::default() };
    let block = "def f(values):\n    total = 0\n    for v in values:\n        total += v * 3\n    return {'n': 1, 'total': total, 'items': [x for x in values if x % 2]}\n\n";
    let inputs = vec![
        ("1MB python", ScanLanguage::Python, block.repeat(1_000_000 / block.len())),
        ("parens", ScanLanguage::Python, format!("x = {}1{}\n", "(".repeat(200_000), ")".repeat(200_000))),
        ("brackets", ScanLanguage::Python, format!("x = {}\n", "[".repeat(400_000))),
        (
            "js nest",
            ScanLanguage::Javascript,
            format!("let x = {}1{};\n", "[{a:".repeat(100_000), "}]".repeat(100_000)),
        ),
        ("bash subst", ScanLanguage::Bash, format!("echo {}\n", "$(".repeat(100_000))),
        ("string", ScanLanguage::Python, format!("s = '{}'\n", "a".repeat(3_000_000))),
        ("lines", ScanLanguage::Bash, "a=1\n".repeat(1_000_000)),
    ];
    for (name, language, code) in inputs {
        let start = std::time::Instant::now();
        let report = scan(language, &code, &policy);
        let first = report.ok().and_then(|r| r.findings.first().map(|f| f.rule.clone()));
        println!("{name}: {:?} {first:?}", start.elapsed());
    }
}
