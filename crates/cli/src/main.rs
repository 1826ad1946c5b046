//! `sandkasten`: run untrusted code in a sandbox. Subcommands: `run` (one-shot), `scan` (the static scan, offline),
//! `gc` (remove leftovers of crashed runs), `doctor` (what this host supports, per tier), `serve` and `config check`
//! (the server and its config file), and the clients of a server.

mod client;
mod config_command;
mod doctor;
mod exit_codes;
mod gc_command;
mod mcp_command;
mod run_command;
mod run_input;
mod run_remote;
mod scan_command;
mod serve_command;
mod template;

use clap::{Parser, Subcommand};

/// Run untrusted code in a sandbox: namespaces, seccomp, landlock and cgroups, with hard limits and a structured result.
#[derive(Debug, Parser)]
#[command(name = "sandkasten", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run code or a program once in a fresh sandbox, then destroy it.
    Run(Box<run_input::RunArgs>),
    /// Scan code statically (no sandbox): findings with rule, line and column, and the verdict under a policy.
    Scan(scan_command::ScanArgs),
    /// Remove sandboxes left behind by a crashed sandkasten (runs automatically when stale records exist).
    Gc {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Serve the HTTP API (long-lived sandboxes: exec with streaming, files) until SIGTERM.
    Serve(serve_command::ServeArgs),
    /// The server's config file: `config check FILE` reports every problem with its key path, line and column.
    Config(config_command::ConfigArgs),
    /// Client of a `sandkasten serve` server: create, list, info, exec, code, cp and rm long-lived sandboxes.
    Sandbox(Box<client::SandboxArgs>),
    /// Your snapshots on a `sandkasten serve` server: list, info, rm (take them with `sandbox snapshot`).
    Snapshot(Box<client::SnapshotArgs>),
    /// Templates: `check` a spec or Dockerfile, `build` it (each step in a build sandbox, layers cached), `list`,
    /// `rm` (with garbage collection of unused layers).
    Template(template::TemplateArgs),
    /// Internal: the single-threaded helper `serve` starts to create sandboxes. Not for use by hand.
    #[command(hide = true)]
    Spawner {
        /// The gvisor tier's runsc (from the server's `[gvisor] runsc`).
        #[arg(long, default_value = "runsc")]
        runsc: std::path::PathBuf,
        /// gVisor's platform (from `[gvisor] platform`).
        #[arg(long, default_value = "systrap")]
        gvisor_platform: String,
        /// The microvm tier's settings as JSON (the server's `[microvm]` table).
        #[arg(long, default_value = "{}")]
        microvm: String,
    },
    /// MCP over stdio for desktop clients (Claude Desktop …): a relay to the `/mcp` endpoint of a `sandkasten
    /// serve` server, with the key from SANDKASTEN_API_KEY.
    Mcp(mcp_command::McpArgs),
    /// Check this host and say, per isolation tier, what works and what to fix.
    Doctor {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// The server's config file: check the microvm tier as its `[microvm]` table says (`accel`,
        /// `allow_emulation`, `qemu`, `dir`).
        #[arg(long)]
        config: Option<std::path::PathBuf>,
    },
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogFormat {
    /// Human-readable text.
    Text,
    /// One JSON object per line (fields at the top level).
    Json,
}

/// The log format: `SANDKASTEN_LOG_FORMAT` (`json` or `text`) when set, otherwise JSON for the server (`serve` and
/// its `spawner`) and text for everything else.
fn log_format(command: &Command, env: Option<&str>) -> LogFormat {
    match env.map(str::trim) {
        Some(value) if value.eq_ignore_ascii_case("json") => LogFormat::Json,
        Some(value) if value.eq_ignore_ascii_case("text") => LogFormat::Text,
        _ if matches!(command, Command::Serve(_) | Command::Spawner { .. }) => LogFormat::Json,
        _ => LogFormat::Text,
    }
}

/// The default log filter when `SANDKASTEN_LOG` is unset: the server logs its requests (`info`), the other commands
/// only warnings.
fn default_filter(command: &Command) -> &'static str {
    if matches!(command, Command::Serve(_)) { "info" } else { "warn" }
}

fn init_logging(command: &Command) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SANDKASTEN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter(command)));
    let format = log_format(command, std::env::var("SANDKASTEN_LOG_FORMAT").ok().as_deref());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).with_span_list(false).init(),
        LogFormat::Text => builder.init(),
    }
}

fn main() {
    // `sandkasten agent`: the agent inside every sandbox (its channel on descriptor 0). Dispatched before anything
    // else runs (no logging, no argument parser): the agent starts nothing it does not need.
    if std::env::args_os().nth(1).is_some_and(|arg| arg == "agent") {
        sandkasten_runtime::run_agent();
    }
    let cli = Cli::parse();
    init_logging(&cli.command);
    let code = match cli.command {
        Command::Run(args) => run_command::run(*args),
        Command::Scan(args) => scan_command::run(&args),
        Command::Gc { json } => gc_command::run(json),
        Command::Serve(args) => serve_command::run(args),
        Command::Config(args) => config_command::run(&args),
        Command::Spawner { runsc, gvisor_platform, microvm } => {
            serve_command::run_spawner(runsc, &gvisor_platform, &microvm)
        }
        Command::Sandbox(args) => client::run(*args),
        Command::Template(args) => template::run(args),
        Command::Snapshot(args) => client::snapshots::run(*args),
        Command::Mcp(args) => mcp_command::run(args),
        Command::Doctor { json, config } => match doctor::run(json, config.as_deref()) {
            Ok(code) => code,
            Err(error) => {
                eprintln!("sandkasten: doctor: {error:#}");
                exit_codes::SANDBOX_ERROR
            }
        },
    };
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(args: &[&str]) -> Command {
        let mut argv = vec!["sandkasten"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv) {
            Ok(cli) => cli.command,
            Err(error) => panic!("{error}"),
        }
    }

    #[test]
    fn serve_logs_json_and_everything_else_text_unless_the_environment_says() {
        let serve = command(&["serve"]);
        let gc = command(&["gc"]);
        assert_eq!(log_format(&serve, None), LogFormat::Json);
        assert_eq!(log_format(&command(&["spawner"]), None), LogFormat::Json);
        assert_eq!(log_format(&gc, None), LogFormat::Text);
        assert_eq!(log_format(&gc, Some("json")), LogFormat::Json);
        assert_eq!(log_format(&gc, Some(" JSON ")), LogFormat::Json);
        assert_eq!(log_format(&serve, Some("text")), LogFormat::Text);
        assert_eq!(log_format(&serve, Some("bogus")), LogFormat::Json);
        assert_eq!(default_filter(&serve), "info");
        assert_eq!(default_filter(&gc), "warn");
    }
}
