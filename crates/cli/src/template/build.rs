//! `sandkasten template build FILE`: the spec's steps, each in a build sandbox over the layers so far (cached by key:
//! an unchanged prefix is reused), then `ready` in a sandbox of the finished layers, then the template record —
//! written only when everything succeeded. Progress on a terminal (indicatif), or one JSON object per line
//! (`--json`: `step`, `output`, `done`, `failed`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use sandkasten_runtime::SandboxRuntime;
use sandkasten_runtime::live::LiveRuntime;
use sandkasten_template::spec::{NPM_PREFIX, VENV_DIR};
use sandkasten_template::{Base, BuildStep, StepKind, TemplateCache, TemplateRecord, TemplateSpec};
use sandkasten_types::{Limits, OutputChunk, StreamKind, units};
use serde_json::json;

use super::build_sandbox::{BuildSandbox, Capture, Refusals, SandboxRecipe, remove_stale_captures};
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

/// The largest output of one step that is kept (and shown when it fails), bytes.
const OUTPUT_KEPT: usize = 64 << 10;
/// The output limit of one step's command, bytes (past it the step fails).
const OUTPUT_LIMIT: u64 = 64 << 20;

/// Takes the cache's lock, waiting for a running build.
pub fn lock(cache: &TemplateCache) -> Result<sandkasten_template::cache::CacheLock, i32> {
    cache.lock().map_err(|error| {
        eprintln!("sandkasten: {error}");
        exit_codes::SANDBOX_ERROR
    })
}

/// Why a build failed: the spec (exit 2: a step or `ready` failed, or the spec cannot be built yet) or sandkasten.
enum BuildError {
    /// A step (`Some((index, title))`) or `ready` (`None`) failed, with its output's tail.
    Failed { step: Option<(usize, String)>, message: String, output: String },
    /// sandkasten itself failed.
    Internal(anyhow::Error),
}

impl From<anyhow::Error> for BuildError {
    fn from(error: anyhow::Error) -> Self {
        BuildError::Internal(error)
    }
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
    if let Err(message) = buildable(&spec) {
        return report_failure(args.json, &spec.name, None, &message, "");
    }
    let spec_dir = args.file.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    let steps = match sandkasten_template::steps::plan_steps(&spec, &spec_dir) {
        Ok(steps) => steps,
        Err(error) => {
            eprintln!("sandkasten: {}: {error}", args.file.display());
            return exit_codes::BAD_INPUT;
        }
    };
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
    let _ = cache.remove_partials();
    remove_stale_captures(&cache.build_dir());
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
        sandkasten_template::registries::discover(&spec, "/usr/bin/python3")
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
    let trust = sandkasten_template::registries::client_trust(&spec, "/usr/bin/python3");
    let builder = Builder { args, spec: &spec, cache: &cache, registries: &registries, trust, egress, runtime: &live };
    let outcome = runtime.block_on(builder.build(&steps));
    drop(runtime);
    drop(live);
    match outcome {
        Ok(record) => {
            if args.json {
                println!(
                    "{}",
                    json!({"event": "done", "name": record.name, "digest": record.digest,
                    "layers": record.layers, "size_bytes": record.size_bytes})
                );
            } else {
                println!("built {} {} ({})", record.name, record.digest, units::format_bytes(record.size_bytes));
            }
            0
        }
        Err(BuildError::Failed { step, message, output }) => {
            report_failure(args.json, &spec.name, step.as_ref(), &message, &output)
        }
        Err(BuildError::Internal(error)) => {
            eprintln!("sandkasten: building {}: {error:#}", spec.name);
            exit_codes::SANDBOX_ERROR
        }
    }
}

/// What this session's builder can build: `host` bases (Debian bases need debootstrap, templates as bases need their
/// layers under the new ones: both come next).
fn buildable(spec: &TemplateSpec) -> Result<(), String> {
    match &spec.base {
        Base::Host => Ok(()),
        Base::Debian(suite) => Err(format!(
            "base \"debian:{}\" is valid but cannot be built yet (debootstrap bases are not implemented): use base = \
             \"host\" for now",
            suite.name()
        )),
        Base::Template(name) => Err(format!(
            "base {name:?} (another template) is valid but cannot be built yet: copy its spec's steps into this one"
        )),
    }
}

/// Reports a failed build (exit 2): the step (`None`: `ready`, or before any step) with its output.
fn report_failure(json: bool, name: &str, step: Option<&(usize, String)>, message: &str, output: &str) -> i32 {
    if json {
        let step = step.map_or(json!("ready"), |(index, title)| json!({"index": index, "title": title}));
        println!("{}", json!({"event": "failed", "name": name, "step": step, "message": message, "output": output}));
    } else {
        if !output.is_empty() {
            let what = step.map_or("ready".to_owned(), |(index, title)| format!("step {} ({title})", index + 1));
            eprintln!("--- output of {what} ---\n{}", output.trim_end());
        }
        eprintln!("sandkasten: template {name}: {message}; no template was made");
    }
    exit_codes::BAD_INPUT
}

/// The environment of the template's sandboxes and build steps: its `env` over `PATH` (venv and npm first) and
/// `NODE_PATH`.
fn template_env(spec: &TemplateSpec) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    let mut path = Vec::new();
    if !spec.packages.pip.is_empty() {
        path.push(format!("{VENV_DIR}/bin"));
        env.insert("VIRTUAL_ENV".to_owned(), VENV_DIR.to_owned());
    }
    if !spec.packages.npm.is_empty() {
        path.push(format!("{NPM_PREFIX}/bin"));
        env.insert("NODE_PATH".to_owned(), format!("{NPM_PREFIX}/lib/node_modules"));
    }
    if !path.is_empty() {
        path.push(sandkasten_jail::environment::SANDBOX_PATH.to_owned());
        env.insert("PATH".to_owned(), path.join(":"));
    }
    env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
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

/// The last `OUTPUT_KEPT` bytes of a step's output.
#[derive(Default)]
struct Tail(Vec<u8>);

impl Tail {
    fn push(&mut self, data: &[u8]) {
        self.0.extend_from_slice(data);
        if self.0.len() > OUTPUT_KEPT {
            let cut = self.0.len() - OUTPUT_KEPT;
            self.0.drain(..cut);
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }
}

struct Builder<'a> {
    args: &'a BuildArgs,
    spec: &'a TemplateSpec,
    cache: &'a TemplateCache,
    registries: &'a [String],
    /// The build steps' own environment (the host clients' TLS roots), not the template's.
    trust: BTreeMap<String, String>,
    /// The build's egress proxy settings (`[egress]` of `--config`), before `--allow-cidr`.
    egress: sandkasten_egress::EgressConfig,
    runtime: &'a Arc<dyn SandboxRuntime>,
}

impl Builder<'_> {
    fn limits(&self) -> Limits {
        Limits {
            timeout_ms: self.args.step_timeout,
            memory_bytes: self.args.memory,
            disk_bytes: self.args.disk,
            pids: 1024,
            output_bytes: OUTPUT_LIMIT,
            ..Limits::default()
        }
    }

    async fn build(&self, steps: &[BuildStep]) -> Result<TemplateRecord, BuildError> {
        let refusals = Arc::new(Refusals::default());
        let sink: Arc<dyn sandkasten_egress::AuditSink> = refusals.clone();
        let mut config = self.egress.clone();
        config.allow_cidrs.extend(self.args.allow_cidrs.iter().cloned());
        if self.args.allow_registry_addresses {
            config.allow_cidrs.extend(registry_addresses(self.registries));
        }
        let proxy = sandkasten_egress::Proxy::new(config, sink).context("starting the egress proxy")?;
        let env = template_env(self.spec);
        let mut layers: Vec<String> = Vec::new();
        let mut reusing = true;
        for step in steps {
            let cached = if reusing { self.cache.cached_layer(&step.key) } else { None };
            let digest = match cached {
                Some(digest) => {
                    self.announce(step, steps.len(), true, Some(&digest));
                    digest
                }
                None => {
                    reusing = false;
                    self.announce(step, steps.len(), false, None);
                    self.run_step(step, steps.len(), &layers, &env, &proxy, &refusals).await?
                }
            };
            layers.push(digest);
        }
        if let Some(ready) = &self.spec.ready {
            self.check_ready(ready, &layers, &env, &proxy).await?;
        }
        let record = TemplateRecord {
            name: self.spec.name.clone(),
            digest: sandkasten_template::cache::template_digest(&layers),
            base: self.spec.base.to_string(),
            size_bytes: self.cache.size_of_layers(&layers),
            layers,
            env,
            workdir: self.spec.workdir.clone(),
            user: self.spec.user_name().to_owned(),
            preload: self.spec.preload.clone(),
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_secs()),
        };
        self.cache.put_template(&record).context("writing the template")?;
        Ok(record)
    }

    fn announce(&self, step: &BuildStep, total: usize, cached: bool, layer: Option<&str>) {
        if self.args.json {
            println!(
                "{}",
                json!({"event": "step", "index": step.index, "title": step.title(), "key": step.key,
                    "cached": cached, "layer": layer})
            );
        } else if cached {
            eprintln!("[{}/{total}] {} (cached)", step.index + 1, step.title());
        }
    }

    fn layer_dirs(&self, layers: &[String]) -> Vec<PathBuf> {
        layers.iter().map(|digest| self.cache.layer_dir(digest)).collect()
    }

    async fn run_step(
        &self,
        step: &BuildStep,
        total: usize,
        layers: &[String],
        env: &BTreeMap<String, String>,
        proxy: &sandkasten_egress::Proxy,
        refusals: &Refusals,
    ) -> Result<String, BuildError> {
        // Refusals of earlier steps are not this one's.
        refusals.take();
        let capture = Capture::new(&self.cache.build_dir(), self.args.disk)?;
        let registries = match step.kind {
            StepKind::Apt(_) | StepKind::Pip(_) | StepKind::Npm(_) | StepKind::Run(_) => self.registries,
            StepKind::Files(_) => &[],
        };
        let mut step_env = env.clone();
        step_env.extend(self.trust.iter().map(|(k, v)| (k.clone(), v.clone())));
        let recipe = SandboxRecipe {
            layers: self.layer_dirs(layers),
            capture: Some(&capture),
            registries,
            env: step_env,
            limits: self.limits(),
            workdir: None,
        };
        let sandbox = BuildSandbox::create(self.runtime, proxy, recipe).await?;
        let progress = self.progress(step, total);
        let mut tail = Tail::default();
        let outcome = async {
            if let StepKind::Files(files) = &step.kind {
                for file in files {
                    sandbox.write_file(&file.dest, file.contents.clone()).await?;
                }
            }
            let json = self.args.json;
            let index = step.index;
            sandbox
                .run(&step.command(), self.args.step_timeout, OUTPUT_LIMIT, |chunk: OutputChunk| {
                    tail.push(&chunk.data);
                    stream_output(json, index, &chunk, progress.as_ref());
                })
                .await
        }
        .await;
        let destroyed = sandbox.destroy().await;
        if let Some(progress) = &progress {
            progress.finish_and_clear();
        }
        let exit = outcome?;
        destroyed?;
        if exit.exit_code != Some(0) {
            let how = match (exit.exit_code, exit.signal, exit.limit) {
                (_, _, Some(limit)) => format!("hit its {limit:?} limit"),
                (Some(code), _, _) => format!("exited with {code}"),
                (None, Some(signal), _) => format!("was killed by signal {signal}"),
                (None, None, None) => "ended without an exit status".to_owned(),
            };
            let mut message = format!("step {} ({}) {how}", step.index + 1, step.title());
            let refused = refusals.take();
            if !refused.is_empty() {
                message.push_str(&format!(
                    "; the egress proxy refused {} (allowed: {:?})",
                    refused.join(", "),
                    registries
                ));
            }
            return Err(BuildError::Failed { step: Some((step.index, step.title())), message, output: tail.text() });
        }
        let digest = self.cache.add_layer(&step.key, &capture.upper()).context("storing the step's layer")?;
        if !self.args.json {
            eprintln!("[{}/{total}] {} → layer {}", step.index + 1, step.title(), &digest[..12.min(digest.len())]);
        }
        Ok(digest)
    }

    fn progress(&self, step: &BuildStep, total: usize) -> Option<ProgressBar> {
        if self.args.json {
            return None;
        }
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg} ({elapsed})").unwrap_or(ProgressStyle::default_spinner()),
        );
        bar.set_message(format!("[{}/{total}] {}", step.index + 1, step.title()));
        bar.enable_steady_tick(std::time::Duration::from_millis(200));
        Some(bar)
    }

    async fn check_ready(
        &self,
        ready: &str,
        layers: &[String],
        env: &BTreeMap<String, String>,
        proxy: &sandkasten_egress::Proxy,
    ) -> Result<(), BuildError> {
        let recipe = SandboxRecipe {
            layers: self.layer_dirs(layers),
            capture: None,
            registries: &[],
            env: env.clone(),
            limits: self.limits(),
            // `ready` runs where the template's commands will: a workdir it cannot enter fails the build.
            workdir: self.spec.workdir.clone(),
        };
        let sandbox = BuildSandbox::create(self.runtime, proxy, recipe).await?;
        let mut tail = Tail::default();
        let json = self.args.json;
        let exit = sandbox
            .run(ready, self.args.step_timeout, OUTPUT_LIMIT, |chunk: OutputChunk| {
                tail.push(&chunk.data);
                if json {
                    stream_output(true, usize::MAX, &chunk, None);
                }
            })
            .await;
        let destroyed = sandbox.destroy().await;
        let exit = exit?;
        destroyed?;
        if exit.exit_code != Some(0) {
            let status = exit.exit_code.map_or_else(|| format!("{:?}", exit.limit), |code| code.to_string());
            let message = format!("ready ({ready}) failed with exit {status}");
            return Err(BuildError::Failed { step: None, message, output: tail.text() });
        }
        if !json {
            eprintln!("ready: {ready} (ok)");
        }
        Ok(())
    }
}

fn stream_output(json: bool, index: usize, chunk: &OutputChunk, progress: Option<&ProgressBar>) {
    if json {
        let stream = match chunk.stream {
            StreamKind::Stdout => "stdout",
            StreamKind::Stderr => "stderr",
        };
        let step = (index != usize::MAX).then_some(index);
        println!(
            "{}",
            json!({"event": "output", "step": step, "stream": stream,
            "data": String::from_utf8_lossy(&chunk.data)})
        );
        return;
    }
    let write = || {
        let _ = std::io::stderr().write_all(&chunk.data);
    };
    match progress {
        Some(bar) => bar.suspend(write),
        None => write(),
    }
}
