//! `sandkasten`: run untrusted code in a sandbox. Subcommands: `run` (one-shot), `gc` (remove leftovers of crashed
//! runs), `doctor` (what this host supports, per tier).

mod client;
mod doctor;
mod exit_codes;
mod gc_command;
mod live_adapter;
mod run_command;
mod run_input;
mod serve_command;

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
    /// Remove sandboxes left behind by a crashed sandkasten (runs automatically when stale records exist).
    Gc {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Serve the HTTP API (long-lived sandboxes: exec with streaming, files) until SIGTERM.
    Serve(serve_command::ServeArgs),
    /// Client of a `sandkasten serve` server: create, list, info, exec, code, cp and rm long-lived sandboxes.
    Sandbox(client::SandboxArgs),
    /// Internal: the single-threaded helper `serve` starts to create sandboxes. Not for use by hand.
    #[command(hide = true)]
    Spawner,
    /// Check this host and say, per isolation tier, what works and what to fix.
    Doctor {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SANDKASTEN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}

fn main() {
    init_logging();
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Run(args) => run_command::run(*args),
        Command::Gc { json } => gc_command::run(json),
        Command::Serve(args) => serve_command::run(args),
        Command::Spawner => serve_command::run_spawner(),
        Command::Sandbox(args) => client::run(args),
        Command::Doctor { json } => match doctor::run(json) {
            Ok(code) => code,
            Err(error) => {
                eprintln!("sandkasten: doctor: {error:#}");
                exit_codes::SANDBOX_ERROR
            }
        },
    };
    std::process::exit(code);
}
