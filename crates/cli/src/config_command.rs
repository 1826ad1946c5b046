//! `sandkasten config check FILE`: reads a server config file as `sandkasten serve` would (plus the keys of
//! `SANDKASTEN_API_KEYS`) and reports every problem, each with its key path, line and column (exit 2), or a one-line
//! summary of what the file configures (exit 0). `--json` prints one object for machines.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use sandkasten_server::{ConfigError, ServerConfig};

use crate::exit_codes;

/// Arguments of `sandkasten config`.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Check a server config file as `sandkasten serve` reads it (with the keys of SANDKASTEN_API_KEYS): every
    /// problem with its key path, line and column (exit 2), or a summary (exit 0).
    #[command(after_help = "The file's JSON schema is docs/config.schema.json (see docs/config.md).\n\nExit codes: 0 \
        valid; 2 problems, or the file cannot be read.")]
    Check {
        /// The config file (TOML), as given to `sandkasten serve --config`.
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// Print `{"ok", "file", "summary"}` or `{"ok", "file", "problems": [{"path", "message", "line",
        /// "column"}]}`.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `sandkasten config …`; the exit code.
pub fn run(args: &ConfigArgs) -> i32 {
    match &args.command {
        ConfigCommand::Check { file, json } => check(file, *json),
    }
}

fn check(file: &Path, json: bool) -> i32 {
    let shown = file.display().to_string();
    match ServerConfig::load_with(Some(file), |_| Ok(())) {
        Ok(config) => {
            let summary = summary(&config);
            match json {
                true => print_json(&serde_json::json!({"ok": true, "file": shown, "summary": summary})),
                false => println!("ok: {shown}: {summary}"),
            }
            0
        }
        Err(ConfigError::Invalid(problems)) => {
            match json {
                true => print_json(&serde_json::json!({"ok": false, "file": shown, "problems": problems.problems})),
                false => {
                    let listed = problems.to_string();
                    // The first line counts them; the others are one problem each, as `sandkasten serve` prints.
                    for line in listed.lines().skip(1) {
                        println!("{}", line.trim_start());
                    }
                    eprintln!("sandkasten: {}", listed.lines().next().unwrap_or_default());
                }
            }
            exit_codes::BAD_INPUT
        }
        Err(error) => {
            match json {
                true => print_json(&serde_json::json!({
                    "ok": false, "file": shown, "problems": [{"path": "", "message": error.to_string()}]
                })),
                false => eprintln!("sandkasten: {error}"),
            }
            exit_codes::BAD_INPUT
        }
    }
}

fn print_json(value: &serde_json::Value) {
    println!("{value}");
}

/// What a valid config sets up, in one line.
fn summary(config: &ServerConfig) -> String {
    let admins = config.tenants.iter().filter(|tenant| tenant.admin).count();
    let keys: usize = config.tenants.iter().map(|tenant| tenant.api_keys.len()).sum();
    let own_scan = config.tenants.iter().filter(|tenant| tenant.scan.is_some()).count();
    let auth = if config.insecure_no_auth { " WITHOUT AUTHENTICATION" } else { "" };
    format!(
        "listen {}{auth}; {} ({admins} admin) with {}; {}; default isolation {}; scan {} ({own_scan} with their own \
         policy); egress: {}, {}",
        config.listen,
        counted(config.tenants.len(), "tenant"),
        counted(keys, "API key"),
        counted(config.pools.len(), "warm pool"),
        config.defaults.isolation,
        config.scan.mode.as_str(),
        counted(config.egress.hosts.len(), "static host"),
        counted(config.egress.allow_cidrs.len(), "allowed CIDR"),
    )
}

fn counted(count: usize, noun: &str) -> String {
    if count == 1 { format!("1 {noun}") } else { format!("{count} {noun}s") }
}
