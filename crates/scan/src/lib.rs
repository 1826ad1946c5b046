//! The static scan run before code: tree-sitter parses Python, JavaScript or bash, per-language rule tables find
//! process calls, eval of computed or decoded code, raw sockets, writes to system paths, destructive commands and
//! fork bombs, and the import graph is checked against a [`ScanPolicy`]. Every scan is bounded (size, deadline,
//! tree size, findings) and answers within its bound.
//!
//! The scan is defence in depth and feedback for the model that wrote the code: the sandbox stays the boundary.

mod bash;
mod engine;
mod finding;
mod findings;
mod imports;
mod javascript;
mod policy;
mod python;
mod rules;

pub use engine::{Bounds, ScanError, scan, scan_with, unreadable};
pub use finding::{Finding, ScanLanguage, ScanReport, Severity, Verdict};
pub use policy::{ImportPolicy, Loosening, Mode, PolicyError, ScanPolicy, ScanPolicyOverride, module_matches};
pub use rules::Rule;

/// A program and its arguments as the bash command line that runs exactly them (each word quoted where needed),
/// for scanning an argv as bash: `["bash", "-c", "rm -rf /"]` scans `rm -rf /` too.
pub fn argv_command_line(argv: &[String]) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c);
    let words: Vec<String> = argv
        .iter()
        .map(|word| {
            if !word.is_empty() && word.chars().all(safe) {
                word.clone()
            } else {
                format!("'{}'", word.replace('\'', "'\\''"))
            }
        })
        .collect();
    words.join(" ")
}

/// Every rule of a language (the shared ones first), for documentation and listings.
pub fn rules(language: ScanLanguage) -> Vec<&'static Rule> {
    let own: &[&Rule] = match language {
        ScanLanguage::Python => python::RULES,
        ScanLanguage::Javascript => javascript::RULES,
        ScanLanguage::Bash => bash::RULES,
    };
    rules::SHARED_RULES.iter().chain(own).copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_argv_becomes_the_command_line_of_the_same_words() {
        let argv: Vec<String> = ["bash", "-c", "rm -rf /", "it's"].map(String::from).to_vec();
        assert_eq!(argv_command_line(&argv), "bash -c 'rm -rf /' 'it'\\''s'");
        let policy = ScanPolicy { mode: Mode::Enforce, ..ScanPolicy::default() };
        let report = scan(ScanLanguage::Bash, &argv_command_line(&argv), &policy).map_err(|e| e.to_string());
        assert_eq!(report.map(|r| r.verdict), Ok(Verdict::Block));
    }

    #[test]
    fn every_rule_has_a_snake_case_id_and_a_one_line_explanation() {
        for language in [ScanLanguage::Python, ScanLanguage::Javascript, ScanLanguage::Bash] {
            for rule in rules(language) {
                assert!(rule.id.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{}", rule.id);
                assert!(!rule.explanation.contains('\n') && !rule.explanation.is_empty(), "{}", rule.id);
            }
        }
    }
}
