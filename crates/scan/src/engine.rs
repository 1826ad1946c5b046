//! The bounded scan: a size check, a parse under a deadline (tree-sitter's progress callback cancels it), an
//! iterative walk that spends a node budget and the same deadline, then the import checks against the policy. An
//! input that reaches a bound answers what was found so far and a `scan_incomplete` finding; it never hangs.

use std::time::{Duration, Instant};

use tree_sitter::{Language, Node, ParseOptions, Parser, Tree};

use crate::finding::{Finding, ScanLanguage, ScanReport};
use crate::findings::Findings;
use crate::imports::{self, Import};
use crate::policy::ScanPolicy;
use crate::rules::SCAN_INCOMPLETE;

/// How much one scan may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Largest code scanned, in bytes; larger is an error ([`ScanError::TooLarge`]). Default 4 MiB (the server's
    /// default JSON body limit).
    pub max_code_bytes: usize,
    /// Wall-clock budget of the parse and the walk together. Default 5 s, on purpose generous: an idle host scans
    /// 1 MB of Python in about a quarter of a second (the parse is most of it), a busy one (two cores, four
    /// builds) took a second; the rest is headroom so that ordinary code is never cut short on a loaded host,
    /// while a pathological input still ends at a known time.
    pub deadline: Duration,
    /// Most syntax-tree nodes walked. Default 8 million (1 MB of dense code is well under 1 million).
    pub max_nodes: usize,
    /// Most findings reported. Default 500.
    pub max_findings: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            max_code_bytes: 4 * 1024 * 1024,
            deadline: Duration::from_secs(5),
            max_nodes: 8_000_000,
            max_findings: 500,
        }
    }
}

/// A scan that could not be done at all.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// The code is larger than [`Bounds::max_code_bytes`].
    #[error("the code is {bytes} bytes, more than the scan's maximum of {max} bytes; send less code")]
    TooLarge {
        /// Its size.
        bytes: usize,
        /// The bound.
        max: usize,
    },
    /// The grammar does not fit the tree-sitter runtime (a build problem, never the input's).
    #[error("the {language} grammar cannot be loaded: {source}")]
    Grammar {
        /// The language.
        language: &'static str,
        /// What tree-sitter said.
        source: tree_sitter::LanguageError,
    },
}

/// What a language contributes: its grammar and a visitor called on every node of the walk.
pub(crate) trait LanguageScan {
    /// The tree-sitter grammar.
    fn grammar() -> Language;
    /// Looks at one node; imports go to `imports`, everything else to `findings`.
    fn visit(&mut self, node: Node<'_>, source: &[u8], findings: &mut Findings, imports: &mut Vec<Import>);
    /// Called once after the walk (rules about the whole file, e.g. a socket and dup2 together).
    fn finish(&mut self, _findings: &mut Findings, _imports: &[Import]) {}
}

/// The report on code in a language the scan has no grammar for (e.g. Java, R): none of it was read, so it carries a
/// `scan_incomplete` finding, which blocks under `enforce` (the scan fails closed, as at its bounds) and warns under
/// `warn`.
pub fn unreadable(language: &str, policy: &ScanPolicy) -> ScanReport {
    let finding = Finding {
        rule: SCAN_INCOMPLETE.id.to_owned(),
        severity: SCAN_INCOMPLETE.severity,
        line: 1,
        column: 1,
        message: format!(
            "the scan cannot read {language} (it reads Python, JavaScript, TypeScript as JavaScript, and bash), so \
             none of the code was checked; under an enforce policy send it in one of those, or ask for a policy \
             without enforce"
        ),
    };
    policy.report(vec![finding])
}

/// Scans `code` under `policy` with the default bounds.
pub fn scan(language: ScanLanguage, code: &str, policy: &ScanPolicy) -> Result<ScanReport, ScanError> {
    scan_with(language, code, policy, &Bounds::default())
}

/// Scans `code` under `policy` within `bounds`.
pub fn scan_with(
    language: ScanLanguage,
    code: &str,
    policy: &ScanPolicy,
    bounds: &Bounds,
) -> Result<ScanReport, ScanError> {
    if code.len() > bounds.max_code_bytes {
        return Err(ScanError::TooLarge { bytes: code.len(), max: bounds.max_code_bytes });
    }
    let deadline = Instant::now() + bounds.deadline;
    let mut findings = Findings::new(bounds.max_findings, deadline, bounds.max_nodes);
    let mut found = Vec::new();
    match language {
        ScanLanguage::Python => run(crate::python::PythonScan::default(), code, &mut findings, &mut found)?,
        ScanLanguage::Javascript => run(crate::javascript::JavascriptScan::default(), code, &mut findings, &mut found)?,
        ScanLanguage::Bash => run(crate::bash::BashScan::default(), code, &mut findings, &mut found)?,
    }
    if let Some(rules) = policy.imports(language) {
        imports::check(&found, rules, &mut findings);
    }
    Ok(policy.report(findings.finish()))
}

/// Parses `source` with `grammar` before the findings' deadline; `None` when the deadline cancelled it.
pub(crate) fn parse(grammar: &Language, source: &[u8], findings: &Findings) -> Result<Option<Tree>, ScanError> {
    let mut parser = Parser::new();
    parser.set_language(grammar).map_err(|source| ScanError::Grammar { language: "scan", source })?;
    let deadline = findings.deadline();
    let mut past_deadline = |_: &tree_sitter::ParseState| Instant::now() >= deadline;
    let options = ParseOptions::new().progress_callback(&mut past_deadline);
    let len = source.len();
    let mut read = |at: usize, _| if at < len { &source[at..] } else { &[][..] };
    Ok(parser.parse_with_options(&mut read, None, Some(options)))
}

/// Walks every node of `tree` in order, depth first, without recursion, until the budget is spent.
pub(crate) fn walk<S: LanguageScan>(
    scanner: &mut S,
    tree: &Tree,
    source: &[u8],
    findings: &mut Findings,
    imports: &mut Vec<Import>,
) {
    let mut cursor = tree.walk();
    loop {
        if !findings.visit() {
            return;
        }
        scanner.visit(cursor.node(), source, findings, imports);
        if cursor.goto_first_child() {
            continue;
        }
        loop {
            if cursor.goto_next_sibling() {
                break;
            }
            if !cursor.goto_parent() {
                return;
            }
        }
    }
}

fn run<S: LanguageScan>(
    mut scanner: S,
    code: &str,
    findings: &mut Findings,
    imports: &mut Vec<Import>,
) -> Result<(), ScanError> {
    let source = code.as_bytes();
    match parse(&S::grammar(), source, findings)? {
        Some(tree) => {
            walk(&mut scanner, &tree, source, findings, imports);
            scanner.finish(findings, imports);
        }
        None => findings.stop("parsing reached its deadline"),
    }
    Ok(())
}
