//! `sandkasten run`: create a sandbox, run one program or piece of code in it, destroy it. Plain mode streams the
//! output and exits with the program's code; `--json` prints one result object. With `--server` the run goes to a
//! running server instead (`run_remote`).

use std::io::Write;
use std::os::fd::AsFd;

use sandkasten_runtime::{OneShotRunner, OutputSink, RuntimeConfig, RuntimeError, StdinSource};
use sandkasten_types::{ExecResult, LimitKind, units::format_bytes, units::format_duration_ms};

use crate::run_input::{self, ProgramStdin, RunArgs};
use crate::{exit_codes, run_remote, scan_command};

/// Streams output to this process's stdout and stderr as it arrives.
struct Terminal;

impl OutputSink for Terminal {
    fn chunk(&mut self, stream: sandkasten_types::StreamKind, bytes: &[u8]) {
        // A closed terminal (EPIPE) must not stop the run: the result is still reported by the exit code.
        let _ = match stream {
            sandkasten_types::StreamKind::Stdout => std::io::stdout().write_all(bytes),
            sandkasten_types::StreamKind::Stderr => std::io::stderr().write_all(bytes),
        };
    }
}

/// Runs `sandkasten run` and returns the exit code.
pub fn run(args: RunArgs) -> i32 {
    let started_ns = sandkasten_runtime::monotonic_ns();
    let input = match run_input::parse(&args) {
        Ok(input) => input,
        Err(message) => {
            eprintln!("sandkasten: {message}");
            return exit_codes::BAD_INPUT;
        }
    };
    // The static scan decides before anything is created, here or on a server.
    if let Some(policy) = &args.policy
        && let Err(code) = scan_command::gate(policy, &input.request.command, args.json)
    {
        return code;
    }
    if let Some(server) = &args.server {
        return run_remote::run(server, &input, args.json, |result| explain(result, &input.spec.limits));
    }
    let backend = match OneShotRunner::new(RuntimeConfig::default()) {
        Ok(backend) => backend,
        Err(error) => return report_error(&error),
    };
    let mut spec = input.spec.clone();
    let chosen = match spec.isolation {
        Some(sandkasten_types::Tier::Auto) => match choose_locally(&backend, &args, &spec.workload) {
            Ok(isolation) => {
                spec.isolation = Some(isolation.tier);
                if !args.json {
                    eprintln!("sandkasten: isolation {isolation}: {}", isolation.reason);
                }
                Some(isolation)
            }
            Err(message) => {
                eprintln!("sandkasten: {message}");
                return exit_codes::BAD_INPUT;
            }
        },
        _ => None,
    };
    let stdin_handle = std::io::stdin();
    let stdin = match input.stdin {
        ProgramStdin::Inherit => StdinSource::Inherit(stdin_handle.as_fd()),
        ProgramStdin::Empty => StdinSource::Empty,
    };
    let mut terminal = Terminal;
    let mut quiet = sandkasten_runtime::DiscardOutput;
    let sink: &mut dyn OutputSink = if args.json { &mut quiet } else { &mut terminal };
    let mut result = match backend.run_with_stdin(&spec, &input.request, stdin, sink, started_ns) {
        Ok(result) => result,
        Err(error) => return report_error(&error),
    };
    if let Some(chosen) = chosen {
        // The tier and its acceleration as the run had them; the reason is the rule's.
        result.isolation.reason = chosen.reason;
    }
    if args.json {
        match serde_json::to_string(&result) {
            Ok(json) => println!("{json}"),
            Err(error) => eprintln!("sandkasten: serialising the result failed: {error}"),
        }
    } else {
        explain(&result, &input.spec.limits);
    }
    exit_codes::for_result(&result)
}

/// `--isolation auto` for a local run: the server's `[isolation.auto]` evaluation with its default rules, the trust
/// of `--trust` (default untrusted, as a server's tenants) and the tiers this host runs as the runtime sees them.
fn choose_locally(
    backend: &OneShotRunner,
    args: &RunArgs,
    workload: &sandkasten_types::Workload,
) -> Result<sandkasten_types::Isolation, String> {
    use sandkasten_server::{AutoConfig, HostTiers, Trust};
    use sandkasten_types::Tier;
    let trust = match args.trust.as_deref() {
        Some("internal") => Trust::Internal,
        _ => Trust::Untrusted,
    };
    let host = HostTiers {
        unusable: Tier::CREATABLE
            .into_iter()
            .filter_map(|tier| backend.tier_unavailable(tier).map(|why| (tier, why)))
            .collect(),
        microvm_accel: Some(backend.microvm_accel()),
    };
    sandkasten_server::choose_auto_isolation(&AutoConfig::default(), trust, workload, &host)
}

fn report_error(error: &RuntimeError) -> i32 {
    eprintln!("sandkasten: {error}");
    match error {
        RuntimeError::InvalidInput(_) | RuntimeError::HostUnsupported(_) => exit_codes::BAD_INPUT,
        RuntimeError::Interrupted(signal) => 128 + signal,
        _ => exit_codes::SANDBOX_ERROR,
    }
}

/// In plain mode, one line on stderr when sandkasten (not the program) decided the outcome.
fn explain(result: &ExecResult, limits: &sandkasten_types::Limits) {
    if let Some(error) = &result.error {
        eprintln!("sandkasten: {}", error.message);
    }
    let note = match result.limit {
        Some(LimitKind::Time) => {
            format!("timed out after {}; the sandbox was killed", format_duration_ms(limits.timeout_ms))
        }
        Some(LimitKind::Output) => {
            format!("output passed {} on one stream; the sandbox was stopped", format_bytes(limits.output_bytes))
        }
        Some(LimitKind::Memory) => {
            format!("memory limit of {} reached; a process was OOM-killed", format_bytes(limits.memory_bytes))
        }
        Some(LimitKind::Disk) => format!("disk limit of {} reached", format_bytes(limits.disk_bytes)),
        Some(LimitKind::Pids) => format!("process limit of {} reached; a fork was refused", limits.pids),
        None => return,
    };
    eprintln!("sandkasten: {note}");
}
