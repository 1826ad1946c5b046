//! `sandkasten sandbox …`: the client of a `sandkasten serve` server: create, list, info, exec, shell, code, cp and rm
//! long-lived sandboxes. The server comes from `--url` or `SANDKASTEN_URL`, the API key from `SANDKASTEN_API_KEY`.
//! Human output by default, `--json` for machine output; errors are one line `sandkasten: <message>`, exit 2 for
//! input errors (the server's 4xx), 125 when the server fails or cannot be reached.

mod code;
mod commands;
mod cp;
mod cp_dir;
pub(crate) mod exec;
pub(crate) mod http;
mod network;
mod output;
mod shell;
pub mod snapshots;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Subcommand};
use sandkasten_types::Tier;

use http::{Client, ClientError};
pub use network::NetworkArgs;
pub use snapshots::SnapshotArgs;

/// Default server URL.
const DEFAULT_URL: &str = "http://127.0.0.1:8080";

/// Arguments of `sandkasten sandbox`.
#[derive(Debug, Args)]
#[command(after_help = "The API key is read from SANDKASTEN_API_KEY and sent as `Authorization: Bearer KEY`.\n\n\
    Examples:\n  id=$(sandkasten sandbox create --metadata owner=me)\n  sandkasten sandbox exec $id -- python3 -c 'print(2+2)'\n  \
    sandkasten sandbox cp data.csv $id:/workspace/data.csv\n  sandkasten sandbox rm $id\n\n\
    Exit codes: 2 bad input or a refused request (4xx); 125 server failure or server not reachable;\n  \
    exec: the command's own code, 124 when its timeout killed it; code: 1 when the cell raised an error.")]
pub struct SandboxArgs {
    /// URL of the sandkasten server.
    #[arg(long, visible_alias = "server", global = true, env = "SANDKASTEN_URL", hide_env_values = true, default_value = DEFAULT_URL, value_name = "URL")]
    pub url: String,
    #[command(subcommand)]
    pub command: SandboxCommand,
}

/// The parser of `--isolation TIER` (`sandbox create`, `run`): one of the tiers' names, anything else a usage error
/// (exit 2) that lists them.
pub fn isolation_parser() -> impl TypedValueParser<Value = Tier> {
    PossibleValuesParser::new(Tier::ALL.map(Tier::name)).map(|name| Tier::from_name(&name).unwrap_or_default())
}

/// Limits of a new sandbox; omitted ones take the server's defaults.
#[derive(Debug, Args)]
pub struct LimitArgs {
    /// Memory limit (swap 0), e.g. 512MiB.
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// CPU bandwidth in CPUs (0.5 = half a core).
    #[arg(long, value_name = "CPUS")]
    pub cpus: Option<f64>,
    /// Maximum number of processes and threads.
    #[arg(long, value_name = "N")]
    pub pids: Option<u64>,
    /// Size of /workspace and /tmp (each).
    #[arg(long, value_name = "SIZE")]
    pub disk: Option<String>,
    /// Longest time one command may run (the default and the maximum of `exec --timeout`), e.g. 30s.
    #[arg(long = "command-timeout", value_name = "DURATION")]
    pub command_timeout: Option<String>,
}

/// The client's subcommands.
#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Create a sandbox and print its id.
    Create {
        #[command(flatten)]
        options: commands::CreateOptions,
        /// Print the sandbox as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List your running sandboxes.
    List {
        /// Only sandboxes with this label (KEY=VALUE). Repeatable: all must match.
        #[arg(long = "metadata", value_name = "KEY=VALUE")]
        metadata: Vec<String>,
        /// Include ended sandboxes (destroyed, expired, lost).
        #[arg(long)]
        all: bool,
        /// Sandboxes fetched per request (1 to 1000): the list is read page by page, each after the last one's
        /// cursor, so sandboxes starting or ending meanwhile are neither repeated nor skipped.
        #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..=1000))]
        page_size: u16,
        /// Print `{"sandboxes": [...]}` as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one sandbox.
    Info {
        /// Sandbox id.
        id: String,
        /// Print the sandbox as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run a command in a sandbox: output is streamed, and the exit code is the command's.
    Exec(exec::ExecArgs),
    /// An interactive terminal in a sandbox (`bash -i -l`, or the command after `--`), sized like this one; exits with
    /// the command's code.
    Shell(shell::ShellArgs),
    /// Run a cell in the sandbox's stateful interpreter (variables persist between calls).
    Code(code::CodeArgs),
    /// Copy a file or directory into or out of a sandbox: `cp LOCAL ID:PATH` or `cp ID:PATH LOCAL` (`-` = stdin/stdout;
    /// directories travel as tar archives).
    Cp {
        /// Source: a local path, `-`, or ID:PATH.
        source: String,
        /// Destination: ID:PATH, a local path, or `-`.
        destination: String,
    },
    /// Change a running sandbox's network policy (new connections follow it at once; `none` cuts open ones).
    Network {
        /// Sandbox id.
        id: String,
        #[command(flatten)]
        network: network::NetworkArgs,
        /// Print the policy as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a sandbox's egress audit: every connection attempt through the proxy and its decision.
    Egress {
        /// Sandbox id.
        id: String,
        /// Newest attempts to show (default 1000).
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
        /// Print `{"events": [...]}` as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Manage your secrets (values reach only their hosts, through the egress proxy).
    #[command(subcommand)]
    Secret(network::SecretCommand),
    /// Pause sandboxes: out of your running quota, their timeout clock stopped; with their processes and memory
    /// (process tier: frozen; gVisor: checkpointed to disk), or with `--filesystem` only their files, everything else
    /// released (the resume starts fresh processes on them).
    Pause {
        /// Sandbox ids.
        #[arg(required = true)]
        ids: Vec<String>,
        /// Keep only the files (home, /tmp, /dev/shm, in the snapshot store); processes end.
        #[arg(long)]
        filesystem: bool,
    },
    /// Resume paused sandboxes: where they were, or on their files when paused with `--filesystem`.
    Resume {
        /// Sandbox ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Save a running sandbox's files (home, /tmp, /dev/shm) as a snapshot and print its id (`sandkasten snapshot`
    /// lists them; `sandbox create --from ID` starts on one).
    Snapshot {
        /// Sandbox id.
        id: String,
        /// A name for the snapshot.
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
        /// Save processes and memory too (on tiers that can).
        #[arg(long)]
        memory: bool,
        /// Print the snapshot as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Copy a running sandbox into new ones (its spec, metadata and files; fresh processes) and print their ids.
    Fork {
        /// Sandbox id.
        id: String,
        /// How many copies (1 to 16).
        #[arg(long, default_value_t = 1, value_name = "N")]
        count: u64,
        /// Print `{"sandboxes": [...]}` as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Destroy sandboxes.
    Rm {
        /// Sandbox ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

/// Runs `sandkasten sandbox …` and returns the exit code.
pub fn run(args: SandboxArgs) -> i32 {
    let key = std::env::var("SANDKASTEN_API_KEY").ok();
    let outcome = Client::new(&args.url, key).and_then(|client| dispatch(&client, args.command));
    match outcome {
        Ok(code) => code,
        Err(error) => {
            eprintln!("sandkasten: {}", error.message);
            error.exit_code
        }
    }
}

fn dispatch(client: &Client, command: SandboxCommand) -> Result<i32, ClientError> {
    match command {
        SandboxCommand::Create { options, json } => commands::create(client, options, json),
        SandboxCommand::Network { id, network, json } => network::set_network(client, &id, &network, json),
        SandboxCommand::Egress { id, limit, json } => network::egress(client, &id, limit, json),
        SandboxCommand::Secret(command) => network::secret(client, command),
        SandboxCommand::List { metadata, all, page_size, json } => {
            commands::list(client, &metadata, all, page_size, json)
        }
        SandboxCommand::Info { id, json } => commands::info(client, &id, json),
        SandboxCommand::Exec(args) => exec::exec(client, args),
        SandboxCommand::Shell(args) => shell::shell(client, args),
        SandboxCommand::Code(args) => code::code(client, args),
        SandboxCommand::Cp { source, destination } => cp::copy(client, &source, &destination),
        SandboxCommand::Pause { ids, filesystem } => {
            let mode = if filesystem { "filesystem" } else { "memory" };
            commands::set_paused(client, &ids, Some(mode))
        }
        SandboxCommand::Resume { ids } => commands::set_paused(client, &ids, None),
        SandboxCommand::Snapshot { id, name, memory, json } => {
            snapshots::take(client, &id, name.as_deref(), memory, json)
        }
        SandboxCommand::Fork { id, count, json } => snapshots::fork(client, &id, count, json),
        SandboxCommand::Rm { ids } => commands::remove(client, &ids),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        sandbox: SandboxArgs,
    }

    fn command(items: &[&str]) -> Result<SandboxCommand, clap::Error> {
        Cli::try_parse_from(std::iter::once("sandbox").chain(items.iter().copied())).map(|cli| cli.sandbox.command)
    }

    #[test]
    fn create_takes_an_isolation_tier() -> Result<(), clap::Error> {
        let tier = |command| match command {
            SandboxCommand::Create { options, .. } => options.isolation,
            _ => None,
        };
        assert_eq!(tier(command(&["create", "--isolation", "gvisor"])?), Some(Tier::Gvisor));
        assert_eq!(tier(command(&["create"])?), None, "unset: the server's default");
        let error = command(&["create", "--isolation", "vm"]).err();
        assert_eq!(error.as_ref().map(clap::Error::exit_code), Some(2));
        let message = error.map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("process, gvisor, microvm, auto"), "{message}");
        Ok(())
    }
}
