//! The build: the planned steps in order, each in a build sandbox over the layers so far (a step whose key the cache
//! knows, in an unchanged prefix, is taken from it), then `ready` in a sandbox of the finished layers, then the
//! template record — written only when everything succeeded. The caller holds the cache's lock.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use sandkasten_runtime::SandboxRuntime;
use sandkasten_template::steps::{FileSource, plan_steps};
use sandkasten_template::{BuildStep, StepKind, TemplateCache, TemplateRecord, TemplateSpec};
use sandkasten_types::{Limits, OutputChunk};

use crate::base::ResolvedBase;
use crate::error::{BuildError, internal};
use crate::event::{BuildEvent, FailedAt, FailedPhase};
use crate::sandbox::{BuildSandbox, Capture, Refusals, SandboxRecipe};

/// The largest output of one step that is kept (and shown when it fails), bytes.
const OUTPUT_KEPT: usize = 64 << 10;
/// The output limit of one step's command, bytes (past it the step fails).
pub const OUTPUT_LIMIT: u64 = 64 << 20;

/// How a build runs.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Each build sandbox's disk (home, `/tmp`, and what one step may add), bytes.
    pub disk: u64,
    /// Each build sandbox's memory limit, bytes.
    pub memory: u64,
    /// How long one step (and `ready`) may run, ms.
    pub step_timeout_ms: u64,
    /// Host patterns (`host:port`, `*.domain`) package steps and `run` steps may reach.
    pub registries: Vec<String>,
    /// The build steps' own environment besides the template's (the host clients' TLS roots).
    pub trust: BTreeMap<String, String>,
    /// The build's egress proxy (its `allow_cidrs` as the caller settled them).
    pub egress: sandkasten_egress::EgressConfig,
}

impl BuildOptions {
    /// Options with the CLI's defaults (2 GiB disk and memory, 30 minutes a step) and these registries.
    pub fn new(registries: Vec<String>) -> BuildOptions {
        BuildOptions {
            disk: 2 << 30,
            memory: 2 << 30,
            step_timeout_ms: 30 * 60 * 1000,
            registries,
            trust: BTreeMap::new(),
            egress: sandkasten_egress::EgressConfig::default(),
        }
    }
}

/// A spec ready to build: its base resolved and its steps keyed. Making one runs nothing, so a request can be
/// refused (exit 2, HTTP 422) before any build output.
#[derive(Debug)]
pub struct Plan {
    spec: TemplateSpec,
    base: ResolvedBase,
    steps: Vec<BuildStep>,
}

impl Plan {
    /// Resolves `spec`'s base in `cache` and plans its steps, reading `[[files]]` from `files`.
    pub fn new(cache: &TemplateCache, spec: TemplateSpec, files: &dyn FileSource) -> Result<Plan, BuildError> {
        let base = ResolvedBase::resolve(cache, &spec)?;
        let steps = plan_steps(&spec, files, base.key(&spec))?;
        Ok(Plan { spec, base, steps })
    }

    /// The spec.
    pub fn spec(&self) -> &TemplateSpec {
        &self.spec
    }

    /// The steps.
    pub fn steps(&self) -> &[BuildStep] {
        &self.steps
    }
}

/// Builds `plan` into `cache` with build sandboxes of `runtime`; each event goes to `events` as it happens.
pub async fn build(
    runtime: &Arc<dyn SandboxRuntime>,
    cache: &TemplateCache,
    options: &BuildOptions,
    plan: &Plan,
    events: &(dyn Fn(BuildEvent) + Send + Sync),
) -> Result<TemplateRecord, BuildError> {
    let builder = Builder { runtime, cache, options, plan, events };
    builder.build().await
}

struct Builder<'a> {
    runtime: &'a Arc<dyn SandboxRuntime>,
    cache: &'a TemplateCache,
    options: &'a BuildOptions,
    plan: &'a Plan,
    events: &'a (dyn Fn(BuildEvent) + Send + Sync),
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

impl Builder<'_> {
    fn limits(&self) -> Limits {
        Limits {
            timeout_ms: self.options.step_timeout_ms,
            memory_bytes: self.options.memory,
            disk_bytes: self.options.disk,
            pids: 1024,
            output_bytes: OUTPUT_LIMIT,
            ..Limits::default()
        }
    }

    async fn build(&self) -> Result<TemplateRecord, BuildError> {
        let spec = &self.plan.spec;
        let base = &self.plan.base;
        let refusals = Arc::new(Refusals::default());
        let sink: Arc<dyn sandkasten_egress::AuditSink> = refusals.clone();
        let proxy = sandkasten_egress::Proxy::new(self.options.egress.clone(), sink)
            .map_err(internal("starting the egress proxy"))?;
        let env = base.env(spec);
        let mut layers = base.layers();
        let steps = &self.plan.steps;
        let mut reusing = true;
        for step in steps {
            let cached = if reusing { self.cache.cached_layer(&step.key) } else { None };
            let digest = match cached {
                Some(digest) => {
                    self.announce(step, steps.len(), Some(&digest));
                    digest
                }
                None => {
                    reusing = false;
                    self.announce(step, steps.len(), None);
                    self.run_step(step, &layers, &env, &proxy, &refusals).await?
                }
            };
            layers.push(digest);
        }
        if let Some(ready) = &spec.ready {
            self.check_ready(ready, &layers, &env, &proxy).await?;
        }
        let layers_for_size = layers.clone();
        let size_bytes =
            self.blocking(move |cache| Ok(cache.size_of_layers(&layers_for_size)), "measuring the layers").await?;
        let record = TemplateRecord {
            name: spec.name.clone(),
            digest: sandkasten_template::cache::template_digest(&layers),
            base: spec.base.to_string(),
            root: base.root.clone(),
            size_bytes,
            layers,
            env,
            workdir: base.workdir(spec),
            user: base.user(spec),
            preload: base.preload(spec),
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_secs()),
        };
        let written = record.clone();
        self.blocking(move |cache| cache.put_template(&written), "writing the template").await?;
        Ok(record)
    }

    /// Runs `work` on the cache on a blocking thread (packing a layer, walking layers, writing records: disk work
    /// that must not hold an async worker of a server).
    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(TemplateCache) -> Result<T, sandkasten_template::CacheError> + Send + 'static,
        doing: &str,
    ) -> Result<T, BuildError> {
        let cache = self.cache.clone();
        tokio::task::spawn_blocking(move || work(cache)).await.map_err(internal(doing))?.map_err(internal(doing))
    }

    fn announce(&self, step: &BuildStep, total: usize, layer: Option<&str>) {
        (self.events)(BuildEvent::Step {
            index: step.index,
            total,
            title: step.title(),
            key: step.key.clone(),
            cached: layer.is_some(),
            layer: layer.map(str::to_owned),
        });
    }

    fn layer_dirs(&self, layers: &[String]) -> Vec<PathBuf> {
        layers.iter().map(|digest| self.cache.layer_dir(digest)).collect()
    }

    async fn run_step(
        &self,
        step: &BuildStep,
        layers: &[String],
        env: &BTreeMap<String, String>,
        proxy: &sandkasten_egress::Proxy,
        refusals: &Refusals,
    ) -> Result<String, BuildError> {
        // Refusals of earlier steps are not this one's.
        refusals.take();
        let capture = Capture::new(&self.cache.build_dir(), self.options.disk)?;
        let registries: &[String] = match step.kind {
            StepKind::Apt(_) | StepKind::Pip(_) | StepKind::Npm(_) | StepKind::Run(_) => &self.options.registries,
            StepKind::Files(_) => &[],
        };
        let mut step_env = env.clone();
        step_env.extend(self.options.trust.iter().map(|(k, v)| (k.clone(), v.clone())));
        let recipe = SandboxRecipe {
            layers: self.layer_dirs(layers),
            capture: Some(&capture),
            registries,
            env: step_env,
            limits: self.limits(),
            workdir: None,
        };
        let sandbox = BuildSandbox::create(self.runtime, proxy, recipe).await?;
        let mut tail = Tail::default();
        let outcome = async {
            if let StepKind::Files(files) = &step.kind {
                for file in files {
                    sandbox.write_file(&file.dest, file.contents.clone()).await?;
                }
            }
            sandbox
                .run(
                    &step.command(),
                    self.options.step_timeout_ms,
                    OUTPUT_LIMIT,
                    |chunk: OutputChunk| {
                        tail.push(&chunk.data);
                        (self.events)(BuildEvent::output(Some(step.index), &chunk));
                    },
                    |bytes| (self.events)(BuildEvent::Download { index: step.index, bytes }),
                )
                .await
        }
        .await;
        let destroyed = sandbox.destroy().await;
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
            let at = FailedAt::Step { index: step.index, title: step.title() };
            return Err(BuildError::Failed { at, message, output: tail.text() });
        }
        let (key, upper) = (step.key.clone(), capture.upper());
        let digest = self.blocking(move |cache| cache.add_layer(&key, &upper), "storing the step's layer").await?;
        (self.events)(BuildEvent::Layer { index: step.index, title: step.title(), layer: digest.clone() });
        Ok(digest)
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
            workdir: self.plan.base.workdir(&self.plan.spec),
        };
        let sandbox = BuildSandbox::create(self.runtime, proxy, recipe).await?;
        let mut tail = Tail::default();
        let exit = sandbox
            .run(
                ready,
                self.options.step_timeout_ms,
                OUTPUT_LIMIT,
                |chunk: OutputChunk| {
                    tail.push(&chunk.data);
                    (self.events)(BuildEvent::output(None, &chunk));
                },
                // `ready` reaches no registry.
                |_| {},
            )
            .await;
        let destroyed = sandbox.destroy().await;
        let exit = exit?;
        destroyed?;
        if exit.exit_code != Some(0) {
            let status = exit.exit_code.map_or_else(|| format!("{:?}", exit.limit), |code| code.to_string());
            let message = format!("ready ({ready}) failed with exit {status}");
            return Err(BuildError::Failed { at: FailedAt::Phase(FailedPhase::Ready), message, output: tail.text() });
        }
        (self.events)(BuildEvent::Ready { command: ready.to_owned() });
        Ok(())
    }
}
