//! The `gvisor` tier: each sandbox is a gVisor container started by `runsc run` from an OCI bundle (`bundle`), with
//! the agent binary as its init and the host end of a socketpair as the container's standard input (the agent's
//! channel). gVisor's own network stack gives the sandbox a loopback only (`--network=none`); the egress door of a
//! long-lived sandbox is a unix socket bound into the sandbox (`--host-uds=open`) that the agent bridges to
//! `127.0.0.1:3128` inside. A plan without a door (a local one-shot run: no network at all) gets neither the bind
//! nor `--host-uds`.
//!
//! Host-side limits: `runsc run` is placed in the sandbox's cgroup before it executes (`--ignore-cgroups`, so runsc
//! itself touches no cgroup), so the Sentry, the gofer and everything they start are charged to and killed with it.
//! A built template's layers are a read-only overlay that runsc's own mount namespace mounts in the bundle (`runsc`)
//! and the bundle binds at `/opt`: the gofer serves the merged tree, and the mount ends with runsc's processes.
//! Steps: record → cgroup → bundle → runsc (in the cgroup: `runsc`) → plan → ready. Pause and resume are a
//! checkpoint to disk and a restore from it (`checkpoint`).

mod bundle;
mod checkpoint;
mod cleanup;
mod memory;
mod oom;
mod resident;
mod runsc;

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sandkasten_jail::rootfs::{RealHostFs, read_only_overlay_options, template_lowers};
use sandkasten_protocol::{AgentPlan, Envelope, Message, read_frame, write_frame};
use sandkasten_types::{SandboxFile, SandboxSpec};

pub(crate) use bundle::{DOOR_SOCKET, DOOR_SOCKET_INSIDE};
pub(crate) use cleanup::GvisorFiles;
pub use cleanup::{leftover_candidates, remove_leftovers};

use crate::backend::process::launch::Launcher;
use crate::config::RuntimeConfig;
use crate::error::RuntimeError;
use crate::guard::SandboxGuard;

/// How long a sandbox may take from `runsc run` to the agent's first answer.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Where gVisor sandboxes keep their bundles, and runsc its state, under the runtime's state directory.
pub(crate) fn bundles_dir(config: &RuntimeConfig) -> PathBuf {
    config.state_dir.join("gvisor")
}

/// runsc's `--root`.
pub(crate) fn runsc_root(config: &RuntimeConfig) -> PathBuf {
    config.state_dir.join("runsc")
}

/// The runsc to run: the configured path, or the configured name found on this process's PATH (the one the
/// availability check and the start both use, so they cannot disagree).
pub(crate) fn resolve_runsc(config: &RuntimeConfig) -> Option<PathBuf> {
    super::resolve_program(&config.gvisor.runsc)
}

/// Whether the configured runsc can be found (see `resolve_runsc`).
pub(crate) fn runsc_installed(config: &RuntimeConfig) -> bool {
    resolve_runsc(config).is_some()
}

/// What to tell a user whose host has no runsc.
pub(crate) fn runsc_missing(config: &RuntimeConfig) -> String {
    format!(
        "isolation \"gvisor\" needs gVisor's runsc, which is not installed ({} not found): scripts/setup.sh installs \
         it (on Debian 12: apt-get install -t bookworm-backports runsc)",
        config.gvisor.runsc.display()
    )
}

/// The host path of the egress door's socket of sandbox `id` (where the host listens for the proxy).
pub fn door_socket(config: &RuntimeConfig, id: &str) -> PathBuf {
    bundles_dir(config).join(id).join("door").join(DOOR_SOCKET)
}

/// The gvisor tier, as one owner sees it.
pub(crate) struct GvisorTier<'a> {
    config: &'a RuntimeConfig,
    agent: &'a Path,
    missing: Option<String>,
    /// Creates a restored sandbox's cgroup again (an owner that pauses: the spawner).
    cgroups: Option<Launcher<'a>>,
}

impl<'a> GvisorTier<'a> {
    /// The tier with `config`'s runsc, starting `agent` in every sandbox; finds out whether runsc is installed.
    pub(crate) fn new(config: &'a RuntimeConfig, agent: &'a Path) -> GvisorTier<'a> {
        let missing = (!runsc_installed(config)).then(|| runsc_missing(config));
        GvisorTier { config, agent, missing, cgroups: None }
    }

    /// The tier of an owner that pauses and resumes sandboxes: `cgroups` creates a restored sandbox's cgroup.
    pub(crate) fn pausing(mut self, cgroups: Launcher<'a>) -> GvisorTier<'a> {
        self.cgroups = Some(cgroups);
        self
    }
}

impl super::TierBackend for GvisorTier<'_> {
    fn tier(&self) -> sandkasten_types::Tier {
        sandkasten_types::Tier::Gvisor
    }

    fn probe(&self) -> Option<String> {
        self.missing.clone()
    }

    fn spawn(
        &self,
        guard: &mut SandboxGuard,
        spec: &SandboxSpec,
        files: &[SandboxFile],
        plan: &AgentPlan,
    ) -> Result<UnixStream, RuntimeError> {
        spawn(self.config, guard, spec, files, plan, self.agent)
    }

    /// `runsc checkpoint`: the sandbox is saved to disk and stops; nothing of it runs and its cgroup is removed.
    fn pause(&self, guard: &mut SandboxGuard) -> Result<(), RuntimeError> {
        checkpoint::checkpoint(self.config, guard)
    }

    /// `runsc restore` in a new cgroup, with a new channel (returned).
    fn resume(&self, guard: &mut SandboxGuard) -> Result<Option<UnixStream>, RuntimeError> {
        let cgroups = self.cgroups.as_ref().ok_or_else(|| {
            RuntimeError::InvalidInput("only the spawner resumes gVisor sandboxes (sandkasten serve)".to_owned())
        })?;
        checkpoint::restore(self.config, cgroups, guard).map(Some)
    }

    fn memory_snapshot_supported(&self) -> Result<(), RuntimeError> {
        Ok(())
    }

    /// `runsc checkpoint --leave-running` into `dir`.
    fn memory_snapshot(&self, guard: &SandboxGuard, dir: &Path) -> Result<(), RuntimeError> {
        memory::snapshot(guard, dir)
    }

    /// A new bundle, then `runsc restore` of the image in `dir`.
    fn spawn_from_memory(
        &self,
        guard: &mut SandboxGuard,
        spec: &SandboxSpec,
        files: &[SandboxFile],
        plan: &AgentPlan,
        dir: &Path,
    ) -> Result<UnixStream, RuntimeError> {
        let host = write_bundle(self.config, guard, spec, files, plan, self.agent)?;
        memory::start_from(self.config, guard, &host, dir)
    }
}

/// Starts the gVisor sandbox `id` for `spec` (its root `files`, the agent's `plan`) into the allocated `guard` (record
/// and cgroup exist) and returns the host end of its agent channel once the agent serves. On error the guard (dropped
/// by the caller) removes everything.
fn spawn(
    config: &RuntimeConfig,
    guard: &mut SandboxGuard,
    spec: &SandboxSpec,
    files: &[SandboxFile],
    plan: &AgentPlan,
    agent: &Path,
) -> Result<UnixStream, RuntimeError> {
    let host = write_bundle(config, guard, spec, files, plan, agent)?;
    let run = ["run".into(), "--bundle".into(), host.bundle.clone().into_os_string()];
    let mut channel = runsc::start(config, guard, &host, &run)?;
    write_frame(&mut channel, &Envelope::new(0, Message::Plan { plan: Box::new(plan.clone()) }))?;
    wait_until_ready(&mut channel, &host.bundle.join("runsc.log"))?;
    oom::shield_runtime(guard);
    Ok(channel)
}

/// Writes the sandbox's OCI bundle and records its host files in `guard` (before the bundle exists, so that a
/// failure from here on removes whatever was made of it).
fn write_bundle(
    config: &RuntimeConfig,
    guard: &mut SandboxGuard,
    spec: &SandboxSpec,
    files: &[SandboxFile],
    plan: &AgentPlan,
    agent: &Path,
) -> Result<GvisorFiles, RuntimeError> {
    let mut host = GvisorFiles::new(config, &guard.id);
    guard.gvisor = Some(host.clone());
    std::fs::create_dir_all(&host.bundle)
        .map_err(|e| RuntimeError::sys_owned(format!("creating {}", host.bundle.display()), e))?;
    let mount_point = host.template_mount_point();
    if !spec.layers.layers.is_empty() {
        let lowers = template_lowers(&spec.layers.layers, &RealHostFs);
        host.template = Some(read_only_overlay_options(&lowers, &mount_point).map_err(|bad| {
            RuntimeError::InvalidInput(format!("template layer {} holds ':', ',' or '\\'", bad.display()))
        })?);
    }
    let bundle_spec = bundle::BundleSpec {
        home: plan.home.as_str(),
        disk_bytes: spec.limits.disk_bytes,
        files,
        uid: plan.uid,
        gid: plan.gid,
        agent,
        door: plan.door.is_some(),
        template: host.template.is_some().then_some(mount_point.as_path()),
    };
    host.read_only = bundle::write(&host.bundle, &bundle_spec, &RealHostFs)?;
    host.door = bundle_spec.door;
    guard.gvisor = Some(host.clone());
    Ok(host)
}

/// Waits for the agent's first frame: `FilesystemReady` (it serves), `SetupFailed` (its reason), or the end of the
/// channel (runsc failed: its last words are in the log).
fn wait_until_ready(channel: &mut UnixStream, log_path: &Path) -> Result<(), RuntimeError> {
    channel.set_read_timeout(Some(READY_TIMEOUT)).map_err(|e| RuntimeError::sys("setting a read timeout", e))?;
    let first = read_frame(channel);
    channel.set_read_timeout(None).map_err(|e| RuntimeError::sys("clearing a read timeout", e))?;
    match first {
        Ok(Some(Envelope { msg: Message::FilesystemReady { .. }, .. })) => Ok(()),
        Ok(Some(Envelope { msg: Message::SetupFailed { message }, .. })) => {
            Err(RuntimeError::Runsc(format!("the sandbox's agent could not start: {message}")))
        }
        Ok(Some(other)) => Err(RuntimeError::Runsc(format!("the agent answered {:?} before it was ready", other.msg))),
        Ok(None) | Err(_) => {
            // Give runsc a moment to finish writing why it stopped.
            std::thread::sleep(Duration::from_millis(50));
            Err(RuntimeError::Runsc(last_words(log_path)))
        }
    }
}

/// The last lines runsc wrote to its log (what it said when it failed).
pub(super) fn last_words(log_path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut file) = std::fs::File::open(log_path) {
        let _ = file.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().filter(|line| !line.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(3)..].join("; ");
    if tail.is_empty() { "the sandbox exited before its agent answered (runsc said nothing)".to_owned() } else { tail }
}
