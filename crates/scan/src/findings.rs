//! The collector a scan writes into: findings with their positions, bounded in number, and the scan's budget (its
//! deadline and how many tree nodes it may still visit).

use std::time::Instant;

use tree_sitter::Node;

use crate::finding::Finding;
use crate::rules::{Rule, SCAN_INCOMPLETE};

/// Where a finding points: line and column from 1 (column in characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Position {
    pub(crate) line: u32,
    pub(crate) column: u32,
}

impl Position {
    /// The start of a node in `source`.
    pub(crate) fn of(node: Node<'_>, source: &[u8]) -> Position {
        let point = node.start_position();
        let start = node.start_byte();
        let line_start = start.saturating_sub(point.column);
        let prefix = source.get(line_start..start).unwrap_or_default();
        let column = String::from_utf8_lossy(prefix).chars().count();
        Position { line: saturate(point.row + 1), column: saturate(column + 1) }
    }

    /// The first character of the code.
    pub(crate) const START: Position = Position { line: 1, column: 1 };
}

fn saturate(value: usize) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

/// What the scan found so far, and what it may still spend.
pub(crate) struct Findings {
    list: Vec<Finding>,
    max_findings: usize,
    deadline: Instant,
    nodes_left: usize,
    /// Why the scan stopped early, once it has.
    stopped: Option<&'static str>,
}

impl Findings {
    pub(crate) fn new(max_findings: usize, deadline: Instant, max_nodes: usize) -> Findings {
        Findings { list: Vec::new(), max_findings, deadline, nodes_left: max_nodes, stopped: None }
    }

    /// The deadline of the whole scan (embedded command lines are parsed within it too).
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Records a finding of `rule` about `subject` (said first, e.g. "os.system runs a shell").
    pub(crate) fn push(&mut self, rule: &Rule, at: Position, subject: impl AsRef<str>) {
        if self.list.len() >= self.max_findings {
            self.stop("it reached its maximum number of findings");
            return;
        }
        let message = format!("{}: {}", subject.as_ref(), rule.explanation);
        self.list.push(Finding {
            rule: rule.id.to_owned(),
            severity: rule.severity,
            line: at.line,
            column: at.column,
            message,
        });
    }

    /// Spends one node of the walk's budget; false once the scan must stop (budget spent or deadline passed).
    pub(crate) fn visit(&mut self) -> bool {
        if self.stopped.is_some() {
            return false;
        }
        if self.nodes_left == 0 {
            self.stop("the syntax tree has more nodes than it walks");
            return false;
        }
        self.nodes_left -= 1;
        // Reading the clock for every node costs more than the walk; every 256th is often enough.
        if self.nodes_left.is_multiple_of(256) && Instant::now() >= self.deadline {
            self.stop("it reached its deadline");
            return false;
        }
        true
    }

    /// Marks the scan as stopped early, for the reason given (the first reason is kept).
    pub(crate) fn stop(&mut self, reason: &'static str) {
        if self.stopped.is_none() {
            self.stopped = Some(reason);
        }
    }

    /// The findings in the order of the code, with `scan_incomplete` first when the scan stopped early.
    pub(crate) fn finish(mut self) -> Vec<Finding> {
        self.list.sort_by_key(|f| (f.line, f.column));
        self.list.dedup();
        if let Some(reason) = self.stopped {
            let message = format!("the scan stopped because {reason}: {}", SCAN_INCOMPLETE.explanation);
            self.list.insert(
                0,
                Finding {
                    rule: SCAN_INCOMPLETE.id.to_owned(),
                    severity: SCAN_INCOMPLETE.severity,
                    line: Position::START.line,
                    column: Position::START.column,
                    message,
                },
            );
        }
        self.list
    }
}
