//! Stateful code-interpreter contexts: per sandbox, any number (up to `MAX_CONTEXTS`) of Python or JavaScript
//! kernels whose variables persist across cells. A language's default context is registered on first use and its
//! kernel started lazily; contexts created explicitly start their kernel at once (so a broken interpreter is an error
//! of the create call), in the context's own working directory if it has one. Cells of one context run one at a time,
//! each with its own environment variables if it has any (the kernel sets them for the cell and puts them back
//! after it); a kernel that is lost (killed at a timeout, died during the cell or between cells) is restarted and the
//! cell's answer says so. A cell is interrupted at its timeout, or earlier when its caller asks (a client that left).
//!
//! A sandbox may hold a spare kernel per language (`prepare`: a warm pool member's, started with the pool's preload
//! modules before any caller had the sandbox). The first kernel a context of that language starts (an explicit create,
//! or the default context's first cell) is the spare, if it still runs, instead of a cold start; restarts start cold.
//! A spare has run no caller's code, and the sandbox it waits in serves one caller only, so adopting it shares nothing.
//!
//! Files: `kernel` (one kernel process), `wire` (its line protocol), `spare` (the spares' bookkeeping), `error`.

mod error;
mod kernel;
mod spare;
mod wire;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandkasten_types::{CellOutcome, CodeLanguage, CodeRun, CommandUser, ContextInfo, Failure, FailureKind, FileKind};

pub use kernel::{BASH_KERNEL, CellOutput, NODE_KERNEL, PYTHON_KERNEL, kernel_command};

use super::agent_client::{AgentClient, sandbox_gone};
use super::background::BackgroundCommand;
use crate::sandbox_runtime::CellInterrupt;
use kernel::{Cell, Kernel};
use spare::Spares;

/// Most contexts one sandbox may have at once.
pub const MAX_CONTEXTS: usize = 16;

/// The sandbox a kernel starts in: its agent, and its memory limit, which a kernel that sizes itself by the machine's
/// memory is told (a JVM's heap: the sandbox's `/proc/meminfo` shows the host's memory).
pub struct KernelHost {
    /// The sandbox's agent.
    pub agent: Arc<AgentClient>,
    /// The sandbox's memory limit in bytes.
    pub memory_bytes: u64,
    /// Whether the sandbox's CPU is emulated (a microVM under TCG): everything in it runs an order of magnitude
    /// slower, a JVM's start included, so a kernel gets longer to start there (`kernel::start_timeout`).
    pub emulated: bool,
}

/// One context.
struct Context {
    id: String,
    language: CodeLanguage,
    default: bool,
    /// The kernel's working directory (`None`: the sandbox's default).
    cwd: Option<String>,
    kernel: tokio::sync::Mutex<Option<Kernel>>,
    /// The running kernel's handle, to kill it without waiting for a running cell.
    running: Mutex<Option<Arc<BackgroundCommand>>>,
    count: AtomicU64,
    removed: AtomicBool,
}

impl Context {
    fn info(&self) -> ContextInfo {
        ContextInfo {
            id: self.id.clone(),
            language: self.language,
            default: self.default,
            execution_count: self.count.load(Ordering::Relaxed),
            cwd: self.cwd.clone(),
        }
    }

    fn set_running(&self, command: Option<Arc<BackgroundCommand>>) {
        if let Ok(mut running) = self.running.lock() {
            *running = command;
        }
    }

    async fn kill_running(&self) {
        let command = self.running.lock().ok().and_then(|running| running.clone());
        if let Some(command) = command {
            let _ = command.kill().await;
        }
    }

    /// Puts a kernel into `slot` (the caller holds the lock): `spare` when given, else a cold start.
    async fn start(&self, host: &KernelHost, slot: &mut Option<Kernel>, spare: Option<Kernel>) -> Result<(), Failure> {
        let kernel = match spare {
            Some(kernel) => kernel,
            None => Kernel::start(host, self.language, &[], self.cwd.as_deref()).await?,
        };
        self.set_running(Some(kernel.command()));
        self.count.store(0, Ordering::Relaxed);
        *slot = Some(kernel);
        Ok(())
    }
}

#[derive(Default)]
struct SandboxContexts {
    by_id: BTreeMap<String, Arc<Context>>,
    defaults: HashMap<CodeLanguage, String>,
}

/// The contexts of every sandbox of one runtime.
#[derive(Default)]
pub struct Contexts {
    sandboxes: Mutex<HashMap<String, SandboxContexts>>,
    spares: Mutex<Spares<Kernel>>,
}

/// Checks that `dir` is a directory of the sandbox (as its user sees it), so a context is never made in a place its
/// kernel cannot start in.
async fn usable_cwd(agent: &Arc<AgentClient>, dir: &str) -> Result<(), Failure> {
    match agent.stat(dir, CommandUser::Sandbox).await {
        Ok(info) if info.kind == FileKind::Dir => Ok(()),
        Ok(_) => Err(error::cwd_unusable(FailureKind::NotADirectory, dir, "is not a directory")),
        Err(failure) if failure.kind == FailureKind::NotFound => {
            Err(error::cwd_unusable(FailureKind::NotFound, dir, "does not exist in the sandbox"))
        }
        Err(failure) => Err(failure),
    }
}

fn new_context_id() -> Result<String, Failure> {
    let mut bytes = [0u8; 8];
    let mut filled = 0;
    while filled < bytes.len() {
        filled += rustix::rand::getrandom(&mut bytes[filled..], rustix::rand::GetRandomFlags::empty())
            .map_err(error::no_id)?;
    }
    Ok(format!("ctx-{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()))
}

impl Contexts {
    fn with<T>(&self, sandbox: &str, f: impl FnOnce(&mut SandboxContexts) -> T) -> Result<T, Failure> {
        let mut map = self.sandboxes.lock().map_err(|_| sandbox_gone())?;
        Ok(f(map.entry(sandbox.to_owned()).or_default()))
    }

    fn register(
        &self,
        sandbox: &str,
        language: CodeLanguage,
        default: bool,
        cwd: Option<String>,
    ) -> Result<Arc<Context>, Failure> {
        let id = new_context_id()?;
        self.with(sandbox, |contexts| {
            if default && let Some(existing) = contexts.defaults.get(&language).and_then(|id| contexts.by_id.get(id)) {
                return Ok(Arc::clone(existing));
            }
            if contexts.by_id.len() >= MAX_CONTEXTS {
                return Err(error::too_many(MAX_CONTEXTS));
            }
            let context = Arc::new(Context {
                id: id.clone(),
                language,
                default,
                cwd,
                kernel: tokio::sync::Mutex::new(None),
                running: Mutex::new(None),
                count: AtomicU64::new(0),
                removed: AtomicBool::new(false),
            });
            contexts.by_id.insert(id.clone(), Arc::clone(&context));
            if default {
                contexts.defaults.insert(language, id);
            }
            Ok(context)
        })?
    }

    fn unregister(&self, sandbox: &str, id: &str) -> Option<Arc<Context>> {
        let mut map = self.sandboxes.lock().ok()?;
        let contexts = map.get_mut(sandbox)?;
        let context = contexts.by_id.remove(id)?;
        contexts.defaults.retain(|_, default| default != id);
        context.removed.store(true, Ordering::Relaxed);
        Some(context)
    }

    fn get(&self, sandbox: &str, id: &str) -> Result<Arc<Context>, Failure> {
        self.with(sandbox, |contexts| contexts.by_id.get(id).cloned())?.ok_or_else(|| error::not_found(id))
    }

    /// Starts a spare kernel of `language` in `sandbox` with the `preload` modules loaded, for the sandbox's first
    /// context of that language to adopt; it replaces the sandbox's spare of that language, if there was one.
    pub async fn prepare(
        &self,
        host: &KernelHost,
        sandbox: &str,
        language: CodeLanguage,
        preload: &[String],
    ) -> Result<(), Failure> {
        let kernel = Kernel::start(host, language, preload, None).await?;
        let replaced = self.spares.lock().map_err(|_| sandbox_gone())?.put(sandbox, language, kernel);
        // Dropping a kernel kills it.
        drop(replaced);
        Ok(())
    }

    /// Kills the spare kernels of `sandbox` and waits (briefly) until they have exited (it will start no context:
    /// its memory and pids are the caller's).
    pub async fn discard_spares(&self, sandbox: &str) {
        let spares = self.spares.lock().map(|mut spares| spares.take_all(sandbox)).unwrap_or_default();
        for kernel in spares {
            kernel.shutdown().await;
        }
    }

    /// The spare kernel of `sandbox` for `language`, if there is one and it still runs (a dead one is dropped).
    fn adopt_spare(&self, sandbox: &str, language: CodeLanguage) -> Option<Kernel> {
        let spare = self.spares.lock().ok()?.take(sandbox, language);
        let mut kernel = spare?;
        if kernel.is_running() {
            return Some(kernel);
        }
        tracing::warn!(sandbox, language = language.as_str(), "the spare kernel had ended; starting one cold");
        None
    }

    /// Creates a context whose kernel runs in `cwd` (`None`: the sandbox's default working directory) and starts
    /// it. A spare kernel (started in the default directory) is adopted only by a context without a `cwd`.
    pub async fn create(
        &self,
        host: &KernelHost,
        sandbox: &str,
        language: CodeLanguage,
        cwd: Option<String>,
    ) -> Result<ContextInfo, Failure> {
        if let Some(dir) = &cwd {
            usable_cwd(&host.agent, dir).await?;
        }
        let context = self.register(sandbox, language, false, cwd)?;
        let mut slot = context.kernel.lock().await;
        let spare = if context.cwd.is_none() { self.adopt_spare(sandbox, language) } else { None };
        if let Err(error) = context.start(host, &mut slot, spare).await {
            drop(slot);
            self.unregister(sandbox, &context.id);
            return Err(error);
        }
        Ok(context.info())
    }

    /// The contexts of a sandbox, by id.
    pub fn list(&self, sandbox: &str) -> Vec<ContextInfo> {
        let map = self.sandboxes.lock();
        let contexts = map.as_ref().ok().and_then(|map| map.get(sandbox));
        contexts.map(|c| c.by_id.values().map(|context| context.info()).collect()).unwrap_or_default()
    }

    /// Removes a context and kills its kernel (a running cell ends with an error).
    pub async fn remove(&self, sandbox: &str, id: &str) -> Result<(), Failure> {
        let context = self.unregister(sandbox, id).ok_or_else(|| error::not_found(id))?;
        context.kill_running().await;
        let mut slot = context.kernel.lock().await;
        if let Some(kernel) = slot.take() {
            kernel.shutdown().await;
        }
        context.set_running(None);
        Ok(())
    }

    /// Restarts a context's kernel: its state is gone, its count starts again.
    pub async fn restart(&self, host: &KernelHost, sandbox: &str, id: &str) -> Result<ContextInfo, Failure> {
        let context = self.get(sandbox, id)?;
        context.kill_running().await;
        let mut slot = context.kernel.lock().await;
        if let Some(kernel) = slot.take() {
            kernel.shutdown().await;
        }
        context.set_running(None);
        context.start(host, &mut slot, None).await?;
        Ok(context.info())
    }

    /// Forgets every context of a sandbox (it is being destroyed; its kernels die with it).
    pub fn forget(&self, sandbox: &str) {
        let spares = self.spares.lock().map(|mut spares| spares.take_all(sandbox)).unwrap_or_default();
        drop(spares);
        let removed = self.sandboxes.lock().ok().and_then(|mut map| map.remove(sandbox));
        for context in removed.into_iter().flat_map(|contexts| contexts.by_id.into_values()) {
            context.removed.store(true, Ordering::Relaxed);
        }
    }

    /// Forgets every context of every sandbox.
    pub fn forget_all(&self) {
        let spares = self.spares.lock().map(|mut spares| spares.clear()).unwrap_or_default();
        drop(spares);
        if let Ok(mut map) = self.sandboxes.lock() {
            map.clear();
        }
    }

    fn resolve(&self, sandbox: &str, request: &CodeRun) -> Result<Arc<Context>, Failure> {
        match (&request.context_id, request.language) {
            (Some(id), requested) => {
                let context = self.get(sandbox, id)?;
                match requested {
                    Some(language) if language != context.language => {
                        Err(error::language_mismatch(id, context.language.as_str(), language.as_str()))
                    }
                    _ => Ok(context),
                }
            }
            (None, Some(language)) => self.register(sandbox, language, true, None),
            (None, None) => Err(error::not_found("(none given and no language)")),
        }
    }

    /// Runs one cell; `interrupt` stops it early as its timeout would. A kernel that ended since the last cell
    /// (killed from outside) is started again first, and the answer says the context was restarted.
    pub async fn run(
        &self,
        host: &KernelHost,
        sandbox: &str,
        request: CodeRun,
        output: CellOutput,
        interrupt: Option<CellInterrupt>,
    ) -> Result<CellOutcome, Failure> {
        let context = self.resolve(sandbox, &request)?;
        let mut slot = context.kernel.lock().await;
        if context.removed.load(Ordering::Relaxed) {
            return Err(error::not_found(&context.id));
        }
        let mut restarted = false;
        if let Some(ended) = slot.take_if(|kernel| !kernel.is_running()) {
            tracing::info!(sandbox, context = %context.id, "the context's interpreter had ended; starting it again");
            ended.shutdown().await;
            context.set_running(None);
            restarted = true;
        }
        if slot.is_none() {
            let spare = if restarted { None } else { self.adopt_spare(sandbox, context.language) };
            context.start(host, &mut slot, spare).await?;
        }
        let Some(kernel) = slot.as_mut() else {
            return Err(error::not_found(&context.id));
        };
        let cell = Cell {
            code: &request.code,
            env: &request.env,
            timeout: Duration::from_millis(request.timeout_ms),
            limit: usize::try_from(request.max_output_bytes).unwrap_or(usize::MAX),
        };
        let run = kernel.run(cell, &output, interrupt).await;
        let mut outcome = CellOutcome {
            context_id: context.id.clone(),
            stdout: run.stdout,
            stderr: run.stderr,
            output_truncated: run.truncated,
            context_restarted: restarted,
            ..CellOutcome::default()
        };
        match run.reply {
            Some(reply) => {
                context.count.store(reply.execution_count, Ordering::Relaxed);
                outcome.execution_count = reply.execution_count;
                outcome.results = reply.results;
                outcome.error = reply.error;
            }
            None => {
                outcome.execution_count = context.count.fetch_add(1, Ordering::Relaxed).saturating_add(1);
                outcome.error = run.host_error;
            }
        }
        if run.kernel_lost {
            if let Some(kernel) = slot.take() {
                kernel.shutdown().await;
            }
            context.set_running(None);
            if !context.removed.load(Ordering::Relaxed) {
                outcome.context_restarted = true;
                if let Err(error) = context.start(host, &mut slot, None).await
                    && let Some(cell_error) = &mut outcome.error
                {
                    cell_error.value = format!("{}; restarting it failed: {error}", cell_error.value);
                }
            }
        }
        Ok(outcome)
    }
}
