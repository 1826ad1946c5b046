//! `sandkasten template build FILE`: the spec's steps, each in a build sandbox over the layers so far (cached by key:
//! an unchanged prefix is reused), then `ready` in a sandbox of the finished layers, then the template record —
//! written only when everything succeeded. Progress on a terminal (indicatif), or one JSON object per line
//! (`--json`: `step`, `output`, `done`, `failed`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use sandkasten_runtime::SandboxRuntime;
use sandkasten_runtime::live::LiveRuntime;
use sandkasten_template::steps::SpecDir;
use sandkasten_template::{TemplateCache, TemplateRecord};
use sandkasten_template_build::{BuildError, BuildEvent, BuildOptions, FailedAt, Plan};
use sandkasten_types::units;

use crate::exit_codes;

/// Arguments of `sandkasten template build`.
#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The spec (`template.toml`) or a `Dockerfile`; `files` are read from its directory.
    pub file: PathBuf,
    /// The template's name (overrides the spec's; a Dockerfile's default: its directory's name).
    #[arg(long)]
    pub name: Option<String>,
    /// One JSON object per line (`step`, `output`, `done`, `failed`) instead of progress bars.
    #[arg(long)]
    pub json: bool,
    /// The server's config file: its `[templates] registries` replace the registries read from the host, and its
    /// `[egress]` table (`allow_cidrs`, `hosts`, timeouts) configures the build's egress proxy.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A host pattern a build step may reach (repeatable): replaces the registries read from the host's pip, npm
    /// and apt configuration.
    #[arg(long = "registry", value_name = "HOST[:PORT]")]
    pub registries: Vec<String>,
    /// Let the build reach the registries' addresses even where they are private or special (a registry mirror on
    /// the local network): each registry's addresses, as resolved now, join the egress proxy's `allow_cidrs`.
    #[arg(long)]
    pub allow_registry_addresses: bool,
    /// A special-range CIDR the build's egress proxy may reach (repeatable; as `[egress] allow_cidrs`).
    #[arg(long = "allow-cidr", value_name = "CIDR")]
    pub allow_cidrs: Vec<String>,
    /// The build sandboxes' disk: their home, `/tmp` and what one step may add to the template, each. Default 2GiB.
    #[arg(long, default_value = "2GiB", value_parser = units::parse_bytes)]
    pub disk: u64,
    /// The build sandboxes' memory limit. Default 2GiB.
    #[arg(long, default_value = "2GiB", value_parser = units::parse_bytes)]
    pub memory: u64,
    /// How long one step may run. Default 30m.
    #[arg(long, default_value = "30m", value_parser = units::parse_duration_ms)]
    pub step_timeout: u64,
}

/// Takes the cache's lock, waiting for a running build.
pub fn lock(cache: &TemplateCache) -> Result<sandkasten_template::cache::CacheLock, i32> {
    cache.lock().map_err(|error| {
        eprintln!("sandkasten: {error}");
        exit_codes::SANDBOX_ERROR
    })
}

/// Runs the build and returns the exit code.
pub fn run(root: &Path, args: &BuildArgs) -> i32 {
    let spec = match sandkasten_template::read_spec(&args.file, args.name.as_deref()) {
        Ok(spec) => spec,
        Err(error) => {
            eprintln!("sandkasten: {}: {error}", args.file.display());
            return exit_codes::BAD_INPUT;
        }
    };
    let spec_dir = args.file.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    let cache = match TemplateCache::open(root) {
        Ok(cache) => cache,
        Err(error) => {
            eprintln!("sandkasten: the template cache: {error}");
            return exit_codes::SANDBOX_ERROR;
        }
    };
    let _lock = match lock(&cache) {
        Ok(lock) => lock,
        Err(code) => return code,
    };
    sandkasten_template_build::clean_leftovers(&cache);
    let name = spec.name.clone();
    let plan = match Plan::new(&cache, spec, &SpecDir(&spec_dir)) {
        Ok(plan) => plan,
        Err(BuildError::Spec(error)) => {
            eprintln!("sandkasten: {}: {error}", args.file.display());
            if args.json
                && let Some(event) = BuildEvent::finished(&name, &Err(BuildError::Spec(error)))
            {
                println!("{}", serde_json::to_string(&event).unwrap_or_default());
            }
            return exit_codes::BAD_INPUT;
        }
        Err(error) => return report(args.json, &name, Err(error)),
    };
    let config = match &args.config {
        Some(path) => match sandkasten_server::ServerConfig::load_with(Some(path), |config| {
            // A build serves nothing: the file's API keys are not needed.
            config.insecure_no_auth = true;
            Ok(())
        }) {
            Ok(config) => Some(config),
            Err(error) => {
                eprintln!("sandkasten: {error}");
                return exit_codes::BAD_INPUT;
            }
        },
        None => None,
    };
    let configured = config.as_ref().map(|c| c.templates.registries.clone()).unwrap_or_default();
    let registries = if !args.registries.is_empty() {
        args.registries.clone()
    } else if !configured.is_empty() {
        configured
    } else {
        sandkasten_template::registries::discover(plan.spec(), "/usr/bin/python3")
    };
    let egress = config.map(|c| c.egress).unwrap_or_default();
    // The spawner is started before any thread exists in this process (it forks).
    let program = match std::env::current_exe() {
        Ok(program) => program,
        Err(error) => {
            eprintln!("sandkasten: cannot find the sandkasten binary: {error}");
            return exit_codes::SANDBOX_ERROR;
        }
    };
    let live = match LiveRuntime::start(&program, sandkasten_runtime::RuntimeConfig::default()) {
        Ok(live) => live,
        Err(error) => {
            eprintln!("sandkasten: starting the spawner failed: {error}");
            return exit_codes::SANDBOX_ERROR;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("sandkasten: starting the async runtime failed: {error}");
            return exit_codes::SANDBOX_ERROR;
        }
    };
    let live: Arc<dyn SandboxRuntime> = Arc::new(live);
    let mut options = BuildOptions::new(Vec::new());
    options.disk = args.disk;
    options.memory = args.memory;
    options.step_timeout_ms = args.step_timeout;
    options.trust = sandkasten_template::registries::client_trust(plan.spec(), "/usr/bin/python3");
    options.egress = egress;
    options.egress.allow_cidrs.extend(args.allow_cidrs.iter().cloned());
    if args.allow_registry_addresses {
        options.egress.allow_cidrs.extend(registry_addresses(&registries));
    }
    options.registries = registries;
    let view = Progress::new(args.json);
    let outcome =
        runtime.block_on(sandkasten_template_build::build(&live, &cache, &options, &plan, &|event| view.show(event)));
    view.clear();
    drop(runtime);
    drop(live);
    report(args.json, &name, outcome)
}

/// Reports the build's end: `done` (exit 0), `failed` with the step's output (exit 2), or sandkasten's own failure.
fn report(json: bool, name: &str, outcome: Result<TemplateRecord, BuildError>) -> i32 {
    if json && let Some(event) = BuildEvent::finished(name, &outcome) {
        println!("{}", serde_json::to_string(&event).unwrap_or_default());
    }
    match outcome {
        Ok(record) => {
            if !json {
                println!("built {} {} ({})", record.name, record.digest, indicatif::HumanBytes(record.size_bytes));
            }
            0
        }
        Err(BuildError::Failed { at, message, output }) => {
            if !json {
                if !output.is_empty() {
                    let what = match at {
                        FailedAt::Step { index, title } => format!("step {} ({title})", index + 1),
                        FailedAt::Phase(_) => "ready".to_owned(),
                    };
                    eprintln!("--- output of {what} ---\n{}", output.trim_end());
                }
                eprintln!("sandkasten: template {name}: {message}; no template was made");
            }
            exit_codes::BAD_INPUT
        }
        Err(BuildError::Spec(error)) => {
            if !json {
                eprintln!("sandkasten: template {name}: {error}; no template was made");
            }
            exit_codes::BAD_INPUT
        }
        Err(BuildError::Internal(error)) => {
            eprintln!("sandkasten: building {name}: {error}");
            exit_codes::SANDBOX_ERROR
        }
    }
}

/// The addresses `registries` (`host:port` patterns) resolve to now, as single-address CIDRs.
fn registry_addresses(registries: &[String]) -> Vec<String> {
    use std::net::ToSocketAddrs;
    let mut found: Vec<String> = registries
        .iter()
        .filter(|pattern| !pattern.starts_with("*."))
        .filter_map(|pattern| pattern.to_socket_addrs().ok())
        .flatten()
        .map(|address| address.ip().to_string())
        .collect();
    found.sort();
    found.dedup();
    found
}

/// The build's events on a terminal (a spinner per running step, its output above it) or as JSON lines.
struct Progress {
    json: bool,
    /// The running step's spinner, and how many steps the build has.
    spinner: Mutex<(Option<ProgressBar>, usize)>,
}

impl Progress {
    fn new(json: bool) -> Progress {
        Progress { json, spinner: Mutex::new((None, 0)) }
    }

    fn show(&self, event: BuildEvent) {
        if self.json {
            println!("{}", serde_json::to_string(&event).unwrap_or_default());
            return;
        }
        let Ok(mut state) = self.spinner.lock() else { return };
        let (spinner, steps) = &mut *state;
        match &event {
            BuildEvent::Step { total, .. } if *steps != *total => {
                *steps = *total;
                drop(state);
                self.show(event);
            }
            BuildEvent::Step { index, total, title, cached: true, .. } => {
                eprintln!("[{}/{total}] {title} (cached)", index + 1);
            }
            BuildEvent::Step { index, total, title, .. } => {
                let bar = ProgressBar::new_spinner();
                bar.set_style(
                    ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                        .unwrap_or(ProgressStyle::default_spinner()),
                );
                bar.set_message(format!("[{}/{total}] {title}", index + 1));
                bar.enable_steady_tick(std::time::Duration::from_millis(200));
                *spinner = Some(bar);
            }
            BuildEvent::Output { step: Some(_), data, .. } => {
                let write = || {
                    let _ = std::io::stderr().write_all(data.as_bytes());
                };
                match spinner.as_ref() {
                    Some(bar) => bar.suspend(write),
                    None => write(),
                }
            }
            BuildEvent::Download { bytes, .. } => {
                if let Some(bar) = spinner.as_ref() {
                    if bar.position() == 0 {
                        bar.set_style(
                            ProgressStyle::with_template(
                                "{spinner} {msg} ({elapsed}) ↓ {binary_bytes} at {binary_bytes_per_sec}",
                            )
                            .unwrap_or(ProgressStyle::default_spinner()),
                        );
                    }
                    bar.set_position(*bytes);
                }
            }
            BuildEvent::Layer { index, title, layer } => {
                let downloaded = spinner.take().map_or(0, |bar| {
                    bar.finish_and_clear();
                    bar.position()
                });
                let layer = &layer[..12.min(layer.len())];
                match downloaded {
                    0 => eprintln!("[{}/{steps}] {title} → layer {layer}", index + 1),
                    bytes => eprintln!(
                        "[{}/{steps}] {title} → layer {layer} (↓ {})",
                        index + 1,
                        indicatif::HumanBytes(bytes)
                    ),
                }
            }
            BuildEvent::Ready { command } => eprintln!("ready: {command} (ok)"),
            BuildEvent::Output { step: None, .. } | BuildEvent::Done { .. } | BuildEvent::Failed { .. } => {}
        }
    }

    /// Removes a spinner a failed step left.
    fn clear(&self) {
        if let Ok(mut state) = self.spinner.lock()
            && let Some(bar) = state.0.take()
        {
            bar.finish_and_clear();
        }
    }
}
