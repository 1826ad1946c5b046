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

pub use engine::{Bounds, ScanError, scan, scan_with};
pub use finding::{Finding, ScanLanguage, ScanReport, Severity, Verdict};
pub use policy::{ImportPolicy, Loosening, Mode, PolicyError, ScanPolicy, ScanPolicyOverride, module_matches};
pub use rules::Rule;

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
    fn every_rule_has_a_snake_case_id_and_a_one_line_explanation() {
        for language in [ScanLanguage::Python, ScanLanguage::Javascript, ScanLanguage::Bash] {
            for rule in rules(language) {
                assert!(rule.id.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{}", rule.id);
                assert!(!rule.explanation.contains('\n') && !rule.explanation.is_empty(), "{}", rule.id);
            }
        }
    }
}
