//! The static scan in the CLI: `sandkasten run --policy FILE` scans before anything runs (an `enforce` refusal
//! exits 2 with the findings, `warn` prints them to stderr and runs), and `sandkasten scan FILE` scans offline.

use std::path::{Path, PathBuf};

use clap::Args;
use sandkasten_scan::{Mode, ScanLanguage, ScanPolicy, ScanReport, Verdict, scan};
use sandkasten_types::{Command, Language};

use crate::exit_codes;

/// Arguments of `sandkasten scan`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  sandkasten scan main.py\n  sandkasten scan --language bash --policy policy.toml \
    --json setup.sh\n\nExit codes: 0 when the verdict is allow or warn; 2 when it is block (or on bad input).")]
pub struct ScanArgs {
    /// The file to scan (`-` for standard input).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// python, javascript (or node) or bash; default from the file's extension (.py, .js/.mjs/.cjs, .sh/.bash).
    #[arg(long, value_name = "LANG")]
    pub language: Option<String>,
    /// A scan policy (TOML: mode, block, [python]/[javascript] allow_imports and deny_imports); default
    /// `mode = "warn"` with no import rules.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Print the report (findings and verdict) as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Reads a policy file.
pub fn read_policy(path: &Path) -> Result<ScanPolicy, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("--policy: cannot read '{}': {e}", path.display()))?;
    ScanPolicy::from_toml_str(&text).map_err(|e| format!("--policy '{}': {e}", path.display()))
}

fn language_named(name: &str) -> Result<ScanLanguage, String> {
    match name {
        "python" | "py" => Ok(ScanLanguage::Python),
        "javascript" | "js" | "node" => Ok(ScanLanguage::Javascript),
        "bash" | "sh" => Ok(ScanLanguage::Bash),
        _ => Err(format!("unknown scan language '{name}': use python, javascript (node) or bash")),
    }
}

/// What the scan reads of a run: its code (C is not scanned), or the program and its arguments as bash.
fn scan_input(command: &Command) -> Option<(ScanLanguage, String)> {
    match command {
        Command::Code { language: Language::Python, code } => Some((ScanLanguage::Python, code.clone())),
        Command::Code { language: Language::Node, code } => Some((ScanLanguage::Javascript, code.clone())),
        Command::Code { language: Language::Bash, code } => Some((ScanLanguage::Bash, code.clone())),
        Command::Code { language: Language::C, .. } => None,
        Command::Argv(argv) => Some((ScanLanguage::Bash, sandkasten_scan::argv_command_line(argv))),
    }
}

/// The gate of `sandkasten run --policy`: `Ok` to run (findings of `warn` printed to stderr), or the exit code
/// of a refusal (the findings printed: as JSON on stdout with `--json`, else on stderr).
pub fn gate(policy_file: &Path, command: &Command, json: bool) -> Result<(), i32> {
    let policy = read_policy(policy_file).map_err(|message| {
        eprintln!("sandkasten: {message}");
        exit_codes::BAD_INPUT
    })?;
    if policy.mode == Mode::Off {
        return Ok(());
    }
    let Some((language, code)) = scan_input(command) else { return Ok(()) };
    let report = scan(language, &code, &policy).map_err(|error| {
        eprintln!("sandkasten: scan: {error}");
        exit_codes::BAD_INPUT
    })?;
    match report.verdict {
        Verdict::Allow => Ok(()),
        Verdict::Warn => {
            eprint!("{}", prefixed(&report));
            Ok(())
        }
        Verdict::Block => {
            let message = format!(
                "the static scan refused the {} code under {} (enforce); nothing was run",
                language.as_str(),
                policy_file.display()
            );
            if json {
                let body = serde_json::json!({
                    "error": {"code": "scan_refused", "message": message, "findings": report.findings},
                });
                println!("{body}");
            } else {
                eprint!("{}", prefixed(&report));
                eprintln!("sandkasten: {message}");
            }
            Err(exit_codes::BAD_INPUT)
        }
    }
}

fn prefixed(report: &ScanReport) -> String {
    report.render_text().lines().map(|line| format!("sandkasten: scan: {line}\n")).collect()
}

/// Runs `sandkasten scan` and returns the exit code.
pub fn run(args: &ScanArgs) -> i32 {
    match scan_file(args) {
        Ok(report) => {
            if args.json {
                match serde_json::to_string(&report) {
                    Ok(json) => println!("{json}"),
                    Err(error) => eprintln!("sandkasten: serialising the report failed: {error}"),
                }
            } else {
                print!("{}", report.render_text());
                println!(
                    "verdict: {}",
                    serde_json::to_value(report.verdict)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                );
            }
            if report.verdict == Verdict::Block { exit_codes::BAD_INPUT } else { 0 }
        }
        Err(message) => {
            eprintln!("sandkasten: {message}");
            exit_codes::BAD_INPUT
        }
    }
}

fn scan_file(args: &ScanArgs) -> Result<ScanReport, String> {
    let language = match (&args.language, args.file.extension().and_then(|e| e.to_str())) {
        (Some(name), _) => language_named(name)?,
        (None, Some(extension)) => ScanLanguage::from_extension(extension)
            .ok_or_else(|| format!("cannot tell the language of '.{extension}': pass --language"))?,
        (None, None) => return Err("cannot tell the language of the file: pass --language".into()),
    };
    let code = if args.file == Path::new("-") {
        let mut code = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut code)
            .map_err(|e| format!("reading the code from stdin failed: {e}"))?;
        code
    } else {
        std::fs::read_to_string(&args.file).map_err(|e| format!("cannot read '{}': {e}", args.file.display()))?
    };
    let policy = match &args.policy {
        Some(path) => read_policy(path)?,
        None => ScanPolicy { mode: Mode::Warn, ..ScanPolicy::default() },
    };
    scan(language, &code, &policy).map_err(|e| e.to_string())
}
