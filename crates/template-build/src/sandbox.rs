//! One build sandbox: a process-tier sandbox whose `/opt` is the template's layers so far (read-only lowers) over a
//! capture directory on a size-limited host tmpfs (the step's writes, i.e. the new layer), whose only way out is the
//! egress proxy (in this process, blind tunnels) with an allowlist of the package registries. It runs one command,
//! streams its output, and is destroyed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustix::mount::{MountFlags, UnmountFlags};
use sandkasten_egress::{AuditEvent, AuditSink, Decision, Mode, Policy, Proxy, SandboxEgress};
use sandkasten_runtime::SandboxRuntime;
use sandkasten_types::{
    CommandExit, CommandSpec, CommandUser, Limits, NetworkMode, NetworkPolicy, OutputChunk, PROXY_PORT, SandboxSpec,
    TemplateLayers, Tier,
};
use tokio::sync::mpsc;

use crate::error::{BuildError, internal};

type Result<T> = std::result::Result<T, BuildError>;

/// The egress attempts a build sandbox's proxy refused (shown with a failing step: a registry that is not allowed).
#[derive(Default)]
pub struct Refusals(Mutex<Vec<String>>);

impl AuditSink for Refusals {
    fn record(&self, event: AuditEvent) {
        if event.decision == Decision::Refused
            && let Ok(mut refused) = self.0.lock()
        {
            refused.push(format!("{}:{} ({})", event.host, event.port, event.rule));
        }
    }
}

impl Refusals {
    /// The refusals so far, emptied.
    pub fn take(&self) -> Vec<String> {
        self.0.lock().map(|mut refused| std::mem::take(&mut *refused)).unwrap_or_default()
    }
}

/// A build step's scratch directory: a tmpfs of the build's disk size, mounted by the host, that the step's overlay
/// writes into; unmounted and removed when dropped.
pub struct Capture {
    path: PathBuf,
}

impl Capture {
    /// Mounts a fresh tmpfs of `bytes` at a new directory under `build_dir`.
    pub fn new(build_dir: &Path, bytes: u64) -> Result<Capture> {
        let mut random = [0u8; 8];
        rustix::rand::getrandom(&mut random, rustix::rand::GetRandomFlags::empty())
            .map_err(internal("random capture name"))?;
        let path = build_dir.join(sandkasten_template::steps::hex(&random));
        std::fs::create_dir(&path).map_err(internal(&format!("creating {}", path.display())))?;
        let capture = Capture { path };
        rustix::mount::mount(
            "sandkasten-build",
            &capture.path,
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            Some(
                std::ffi::CString::new(format!("size={bytes},mode=0755"))
                    .map_err(internal("tmpfs options"))?
                    .as_c_str(),
            ),
        )
        .map_err(internal(&format!("mounting the build's tmpfs at {}", capture.path.display())))?;
        Ok(capture)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the step wrote (`upper/`, holding `opt/…`).
    pub fn upper(&self) -> PathBuf {
        self.path.join("upper")
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.path, UnmountFlags::DETACH);
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Unmounts and removes what killed builds, pushes and pulls left in `build_dir`: step captures (directories, maybe
/// still mounted) and layer archives on their way to or from the template store (files). The caller holds the
/// cache's lock, so nothing that writes there runs.
pub fn remove_stale_captures(build_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(build_dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let _ = rustix::mount::unmount(&path, UnmountFlags::DETACH);
        if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
            let _ = std::fs::remove_dir_all(&path);
        } else {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// What a build sandbox is made of.
pub struct SandboxRecipe<'a> {
    /// Unpacked layers below the step, lowest first.
    pub layers: Vec<PathBuf>,
    /// Where the step's writes go (`None`: a read-only template, for `ready`).
    pub capture: Option<&'a Capture>,
    /// Registry host patterns the sandbox may reach (empty: no network).
    pub registries: &'a [String],
    /// Its environment.
    pub env: std::collections::BTreeMap<String, String>,
    /// Its limits.
    pub limits: Limits,
    /// The default working directory of its commands (the template's `workdir`, for `ready`; none: the home).
    pub workdir: Option<String>,
}

/// A running build sandbox.
pub struct BuildSandbox<'a> {
    runtime: &'a Arc<dyn SandboxRuntime>,
    id: String,
    proxy: Option<sandkasten_egress::ProxyHandle>,
    /// Its egress state (when it may reach registries): what it downloaded so far.
    egress: Option<Arc<SandboxEgress>>,
    /// Whether `destroy` ran (else `Drop` destroys it).
    destroyed: bool,
}

/// How often a running step's download count is looked at (and reported when it grew).
const DOWNLOAD_TICK: std::time::Duration = std::time::Duration::from_millis(250);

impl<'a> BuildSandbox<'a> {
    /// Creates the sandbox (and its egress when it may reach registries).
    pub async fn create(
        runtime: &'a Arc<dyn SandboxRuntime>,
        proxy: &Proxy,
        recipe: SandboxRecipe<'_>,
    ) -> Result<Self> {
        let mut random = [0u8; 8];
        rustix::rand::getrandom(&mut random, rustix::rand::GetRandomFlags::empty())
            .map_err(internal("random sandbox id"))?;
        let id = format!("sb-{}", sandkasten_template::steps::hex(&random));
        let network = if recipe.registries.is_empty() {
            NetworkPolicy::none()
        } else {
            NetworkPolicy { mode: NetworkMode::Allowlist, allow: recipe.registries.to_vec(), ..NetworkPolicy::none() }
        };
        let spec = SandboxSpec {
            isolation: Some(Tier::Process),
            limits: recipe.limits,
            env: recipe.env,
            network: network.clone(),
            layers: TemplateLayers {
                layers: recipe.layers,
                capture: recipe.capture.map(|capture| capture.path().to_path_buf()),
                name: None,
                workdir: recipe.workdir,
                user: None,
            },
            ..SandboxSpec::default()
        };
        runtime.create(&id, &spec).await.map_err(|failure| internal("creating the build sandbox")(failure.message))?;
        // From here the sandbox exists: a failure below (or a dropped future) destroys it (`Drop`).
        let mut sandbox = BuildSandbox { runtime, id, proxy: None, egress: None, destroyed: false };
        if network.reaches_out() {
            let policy = Policy::compile(Mode::Allowlist, &network.allow, &[])
                .map_err(|e| internal(&format!("registry pattern {:?}", e.pattern))(e.reason))?;
            let entrance = runtime
                .listen_in_sandbox(&sandbox.id, PROXY_PORT)
                .map_err(|failure| internal("opening the build sandbox's egress")(failure.message))?;
            let egress = Arc::new(SandboxEgress::new(sandbox.id.clone(), "template-build", policy, None));
            sandbox.proxy = Some(
                proxy
                    .serve_at(entrance, Arc::clone(&egress))
                    .map_err(internal("serving the build sandbox's egress"))?,
            );
            sandbox.egress = Some(egress);
        }
        Ok(sandbox)
    }

    /// Writes `contents` to `path` as the sandbox user, creating its parents.
    pub async fn write_file(&self, path: &str, contents: Vec<u8>) -> Result<()> {
        if let Some(parent) = Path::new(path).parent() {
            let parent = parent.to_string_lossy();
            self.runtime
                .mkdir_as(&self.id, &parent, true, CommandUser::Sandbox)
                .await
                .map_err(|failure| internal(&format!("creating {parent}"))(failure.message))?;
        }
        self.runtime
            .write_file_as(&self.id, path, contents, CommandUser::Sandbox)
            .await
            .map_err(|failure| internal(&format!("writing {path}"))(failure.message))
    }

    /// The bytes the sandbox downloaded from registries so far.
    fn downloaded(&self) -> u64 {
        self.egress.as_ref().map_or(0, |egress| egress.traffic().bytes_down())
    }

    /// Runs `command` with bash as the sandbox user; each output chunk goes to `output` as it comes, and the bytes
    /// downloaded so far to `downloaded` whenever they grew (looked at every `DOWNLOAD_TICK`, and at the end).
    pub async fn run(
        &self,
        command: &str,
        timeout_ms: u64,
        output_limit: u64,
        mut output: impl FnMut(OutputChunk),
        mut downloaded: impl FnMut(u64),
    ) -> Result<CommandExit> {
        let spec =
            CommandSpec { cmd: Some(command.to_owned()), timeout_ms: Some(timeout_ms), ..CommandSpec::default() };
        let (sender, mut receiver) = mpsc::channel(64);
        let exec = self.runtime.exec(&self.id, spec, output_limit, sender);
        tokio::pin!(exec);
        let mut ticks = tokio::time::interval(DOWNLOAD_TICK);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut reported = 0;
        let mut report = |now: u64| {
            if now > reported {
                reported = now;
                downloaded(now);
            }
        };
        let exit = loop {
            tokio::select! {
                chunk = receiver.recv() => match chunk {
                    Some(chunk) => output(chunk),
                    None => break exec.await,
                },
                exit = &mut exec => {
                    while let Ok(chunk) = receiver.try_recv() {
                        output(chunk);
                    }
                    break exit;
                }
                _ = ticks.tick(), if self.egress.is_some() => report(self.downloaded()),
            }
        };
        report(self.downloaded());
        exit.map_err(|failure| internal("running the step")(failure.message))
    }

    /// Destroys the sandbox and stops its egress.
    pub async fn destroy(mut self) -> Result<()> {
        if let Some(proxy) = self.proxy.take() {
            proxy.shutdown().await;
        }
        self.destroyed = true;
        self.runtime
            .destroy(&self.id)
            .await
            .map_err(|failure| internal("destroying the build sandbox")(failure.message))
    }
}

impl Drop for BuildSandbox<'_> {
    /// A sandbox not destroyed by `destroy` (its creation failed half-way, or the build's future was dropped: a
    /// stopping server) is destroyed by a task of its own, so a long-lived process (the server) does not keep it.
    fn drop(&mut self) {
        if self.destroyed {
            return;
        }
        let (runtime, id) = (Arc::clone(self.runtime), std::mem::take(&mut self.id));
        let proxy = self.proxy.take();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Some(proxy) = proxy {
                    proxy.shutdown().await;
                }
                if let Err(failure) = runtime.destroy(&id).await {
                    tracing::warn!(sandbox = %id, error = %failure.message, "destroying an abandoned build sandbox");
                }
            });
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn what_killed_builds_pushes_and_pulls_left_is_removed() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        std::fs::create_dir_all(dir.path().join("step-1/upper/opt")).unwrap();
        std::fs::write(dir.path().join("step-1/upper/opt/file"), b"x").unwrap();
        std::fs::write(dir.path().join("pull-Ab12"), b"half a layer").unwrap();
        std::fs::write(dir.path().join("push-Cd34"), b"half a layer").unwrap();
        remove_stale_captures(dir.path());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
