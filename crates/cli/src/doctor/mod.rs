//! `sandkasten doctor`: checks this host and says, per isolation tier, what works and what to fix. Each check
//! group has its own file; `report` holds the vocabulary and renderings, `tiers` the per-tier verdicts.

mod cgroups;
mod gvisor;
mod host;
mod kernel;
mod kvm;
mod microvm;
mod namespaces;
mod report;
mod tiers;

use std::io::Write;
use std::path::Path;

use report::{Check, Report};
use sandkasten_types::MicrovmSettings;

/// Runs every check, prints the report (aligned text, or one JSON object with `json`) to stdout, and returns the
/// exit code: 0 when the default `process` tier is usable, 1 otherwise. With `config` (the server's config file) the
/// microvm tier is checked as its `[microvm]` table says; without, as the defaults do.
pub fn run(json: bool, config: Option<&Path>) -> anyhow::Result<i32> {
    let settings = match config {
        Some(path) => sandkasten_server::ServerConfig::from_file(path)?.microvm,
        None => MicrovmSettings::default(),
    };
    let mut stdout = std::io::stdout().lock();
    let code = run_to(&mut stdout, json, &settings)?;
    stdout.flush()?;
    Ok(code)
}

/// `run`, writing to `out`.
fn run_to(out: &mut dyn Write, json: bool, microvm: &MicrovmSettings) -> anyhow::Result<i32> {
    let report = collect(microvm);
    if json {
        writeln!(out, "{}", report::render_json(&report)?)?;
    } else {
        write!(out, "{}", report::render_text(&report))?;
    }
    Ok(exit_code(&report))
}

/// Every check in report order, and the tiers' verdicts.
fn collect(microvm_settings: &MicrovmSettings) -> Report {
    let mut checks: Vec<Check> = vec![
        namespaces::root(),
        namespaces::user_namespaces(),
        cgroups::check(),
        kernel::seccomp(),
        kernel::landlock(),
        kernel::filesystems(),
    ];
    checks.extend(gvisor::checks());
    let qemu = microvm::qemu(microvm_settings);
    let verdict = sandkasten_runtime::microvm_accel_verdict(microvm_settings);
    let choice = microvm::choice(microvm_settings);
    checks.extend([
        qemu,
        microvm::boot_files(microvm_settings),
        kvm::device(),
        kvm::speed(verdict.as_ref()),
        microvm::acceleration(microvm_settings, &choice),
    ]);
    let tiers = tiers::summarize(&checks, Some(&choice));
    Report { checks, tiers }
}

/// 0 when the default tier works, 1 otherwise (the other tiers are optional).
fn exit_code(report: &Report) -> i32 {
    if report.tiers.process.usable { 0 } else { 1 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::report::{CheckId, Status};

    #[test]
    fn json_report_on_this_host_has_every_check_and_every_tier() {
        let mut out = Vec::new();
        let code = run_to(&mut out, true, &MicrovmSettings::default()).unwrap_or(-1);
        let json = String::from_utf8_lossy(&out);
        let value: serde_json::Value = serde_json::from_str(&json).unwrap_or_default();
        let checks = value["checks"].as_array().cloned().unwrap_or_default();
        assert_eq!(checks.len(), 13, "{json}");
        for check in &checks {
            assert!(check["name"].is_string() && check["detail"].is_string(), "{check}");
            if check["status"] != "ok" {
                assert!(check["fix"].is_string(), "not ok without a fix: {check}");
            }
        }
        for tier in tiers::REPORTED {
            assert!(value["tiers"][tier.name()]["usable"].is_boolean(), "{json}");
            assert!(value["tiers"][tier.name()]["reason"].is_string(), "{json}");
        }
        let process_usable = value["tiers"]["process"]["usable"] == true;
        assert_eq!(code, if process_usable { 0 } else { 1 }, "{json}");
    }

    #[test]
    fn exit_code_follows_the_process_tier_only() {
        let checks = vec![Check::fail(CheckId::Root, "uid 1000", "run as root")];
        let tiers = tiers::summarize(&checks, None);
        let report = Report { checks, tiers };
        assert_eq!(exit_code(&report), 1);
        assert_eq!(report.checks[0].status, Status::Fail);
    }
}
