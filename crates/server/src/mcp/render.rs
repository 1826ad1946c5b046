//! Results of the service layer as MCP content: a command's or a cell's outcome as one text block (how it ended,
//! which limit fired, stdout, stderr, the static scan's findings under a `warn` policy), a cell's PNG results as
//! image blocks, a scan's verdict and findings.

use std::fmt::Write;

use rmcp::model::ContentBlock;

use crate::api::code_schemas::CodeResponse;
use crate::api::schemas::ExecResponse;
use sandkasten_scan::{Finding, ScanReport};

/// `exec`'s answer.
pub(super) fn exec(response: &ExecResponse) -> Vec<ContentBlock> {
    let exit = &response.exit;
    let mut text = format!("sandbox {} ({})\n", response.sandbox_id, response.isolation);
    match (exit.exit_code, exit.signal) {
        (Some(code), _) => writeln!(text, "exit_code: {code}"),
        (None, Some(signal)) => writeln!(text, "signal: {signal}"),
        (None, None) => writeln!(text, "exit_code: none"),
    }
    .ok();
    writeln!(text, "limit: {}", exit.limit.map_or("none", |limit| limit.as_str())).ok();
    if exit.timed_out {
        text.push_str("timed_out: true\n");
    }
    if exit.oom_killed {
        text.push_str("oom_killed: true\n");
    }
    section(&mut text, "stdout", &response.stdout, response.stdout_base64.is_some(), response.stdout_truncated);
    section(&mut text, "stderr", &response.stderr, response.stderr_base64.is_some(), response.stderr_truncated);
    findings(&mut text, &response.findings);
    vec![ContentBlock::text(text)]
}

/// `scan_code`'s answer: the verdict, then one line per finding.
pub(super) fn scan(report: &ScanReport) -> Vec<ContentBlock> {
    let mut text = format!("verdict: {}\n", report.verdict.as_str());
    findings(&mut text, &report.findings);
    if report.findings.is_empty() {
        text.push_str("no findings\n");
    }
    vec![ContentBlock::text(text)]
}

/// A `--- scan findings ---` section (none when there are none): `rule (severity) at LINE:COLUMN: message`.
fn findings(text: &mut String, findings: &[Finding]) {
    if findings.is_empty() {
        return;
    }
    text.push_str("--- scan findings ---\n");
    for finding in findings {
        writeln!(
            text,
            "{} ({}) at {}:{}: {}",
            finding.rule,
            finding.severity.as_str(),
            finding.line,
            finding.column,
            finding.message
        )
        .ok();
    }
}

/// `run_code`'s answer: the text, then one image block per PNG result.
pub(super) fn cell(response: &CodeResponse, one_shot: bool) -> Vec<ContentBlock> {
    let mut text = format!("sandbox {} ({})", response.sandbox_id, response.isolation);
    if one_shot {
        text.push_str(", killed after this call");
    }
    writeln!(text, "\nexecution_count: {}", response.execution_count).ok();
    if response.context_restarted {
        text.push_str("context_restarted: true (variables of earlier calls are gone)\n");
    }
    section(&mut text, "stdout", &response.stdout, false, response.output_truncated);
    section(&mut text, "stderr", &response.stderr, false, response.output_truncated);
    if let Some(main) = response.results.iter().find(|r| r.is_main_result).and_then(|r| r.text_plain.as_deref()) {
        writeln!(text, "--- result ---\n{main}").ok();
    }
    if let Some(error) = &response.error {
        writeln!(text, "--- error ---\n{}: {}", error.name, error.value).ok();
        for line in &error.traceback {
            writeln!(text, "{line}").ok();
        }
    }
    findings(&mut text, &response.findings);
    let mut blocks = vec![ContentBlock::text(text)];
    blocks.extend(
        response.results.iter().filter_map(|r| r.image_png.as_ref()).map(|png| ContentBlock::image(png, "image/png")),
    );
    blocks
}

/// A `--- NAME ---` section with a stream's text.
fn section(text: &mut String, name: &str, body: &str, binary: bool, truncated: bool) {
    writeln!(text, "--- {name} ---").ok();
    if binary {
        text.push_str("(binary output, not shown)\n");
    } else {
        text.push_str(body);
        if !body.is_empty() && !body.ends_with('\n') {
            text.push('\n');
        }
    }
    if truncated {
        writeln!(text, "({name} was cut at the sandbox's output limit)").ok();
    }
}
