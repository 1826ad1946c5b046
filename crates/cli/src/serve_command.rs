//! `sandkasten serve`: the HTTP API over long-lived sandboxes, and `sandkasten spawner`, the single-threaded helper
//! process the server starts to create them (never run by hand).

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use sandkasten_runtime::live::LiveRuntime;
use sandkasten_runtime::{RuntimeConfig, SandboxRuntime};
use sandkasten_server::ServerConfig;
use sandkasten_types::GvisorSettings;

use crate::exit_codes;

/// Arguments of `sandkasten serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Configuration file (TOML: listen, database, tenants with api_keys and quotas, timeouts, size limits, warm pools).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on (overrides the file). Default 127.0.0.1:8080.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// SQLite database file (overrides the file). Default /var/lib/sandkasten/sandkasten.db.
    #[arg(long, value_name = "PATH")]
    pub database: Option<PathBuf>,
    /// Serve without API keys, every request as tenant `default`. Refused unless listening on loopback.
    #[arg(long)]
    pub insecure_no_auth: bool,
}

fn load_config(args: &ServeArgs) -> Result<ServerConfig, String> {
    // The command line's overrides (e.g. --insecure-no-auth) apply before validation; the problems are the ones
    // `sandkasten config check` prints.
    let config = ServerConfig::load_with(args.config.as_deref(), |config| {
        if let Some(listen) = &args.listen {
            config.listen.clone_from(listen);
        }
        if let Some(database) = &args.database {
            config.database.clone_from(database);
        }
        config.insecure_no_auth |= args.insecure_no_auth;
        Ok(())
    })
    .map_err(|e| e.to_string())?;
    if let Some(parent) = config.database.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
    }
    Ok(config)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut terminate), Ok(mut interrupt)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    tracing::info!("stop signal received: draining");
}

/// Runs the server until SIGTERM or SIGINT; every sandbox is destroyed on the way out.
pub fn run(args: ServeArgs) -> i32 {
    let config = match load_config(&args) {
        Ok(config) => config,
        Err(message) => {
            eprintln!("sandkasten: {message}");
            return exit_codes::BAD_INPUT;
        }
    };
    let program = match std::env::current_exe() {
        Ok(program) => program,
        Err(error) => {
            eprintln!("sandkasten: cannot find the sandkasten binary to start the spawner: {error}");
            return exit_codes::SANDBOX_ERROR;
        }
    };
    // The spawner starts before the tokio runtime exists: from here on this process has threads and never forks.
    let runtime_config =
        RuntimeConfig { gvisor: config.gvisor.clone(), microvm: config.microvm.clone(), ..RuntimeConfig::default() };
    let live = match LiveRuntime::start(&program, runtime_config) {
        Ok(live) => live,
        Err(error) => {
            eprintln!("sandkasten: starting the spawner failed: {error}");
            return exit_codes::SANDBOX_ERROR;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("sandkasten: starting the async runtime failed: {error}");
            return exit_codes::SANDBOX_ERROR;
        }
    };
    let live: Arc<dyn SandboxRuntime> = Arc::new(live);
    let outcome = runtime.block_on(sandkasten_server::serve(config, Arc::clone(&live), shutdown_signal()));
    // Dropping the live runtime closes the spawner's socket: it destroys every sandbox and exits.
    drop(runtime);
    drop(live);
    match outcome {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("sandkasten: {error}");
            exit_codes::SANDBOX_ERROR
        }
    }
}

/// `sandkasten spawner`: serves the control socket the server passed as standard input.
pub fn run_spawner(runsc: std::path::PathBuf, platform: &str, microvm: &str) -> i32 {
    let platform = match serde_json::from_value(serde_json::Value::String(platform.to_owned())) {
        Ok(platform) => platform,
        Err(error) => {
            eprintln!("sandkasten spawner: --gvisor-platform {platform}: {error}");
            return exit_codes::BAD_INPUT;
        }
    };
    let microvm = match serde_json::from_str(microvm) {
        Ok(microvm) => microvm,
        Err(error) => {
            eprintln!("sandkasten spawner: --microvm {microvm}: {error}");
            return exit_codes::BAD_INPUT;
        }
    };
    let config = RuntimeConfig { gvisor: GvisorSettings { runsc, platform }, microvm, ..RuntimeConfig::default() };
    let control = match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => fd,
        Err(error) => {
            eprintln!("sandkasten spawner: no control socket on stdin: {error}");
            return exit_codes::SANDBOX_ERROR;
        }
    };
    sandkasten_runtime::spawner::run_spawner(control, config)
}
