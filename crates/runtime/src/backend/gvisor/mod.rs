//! The `gvisor` tier: each sandbox is a gVisor container started by `runsc run` from an OCI bundle (`bundle`), with
//! the agent binary as its init and the host end of a socketpair as the container's standard input (the agent's
//! channel). gVisor's own network stack gives the sandbox a loopback only (`--network=none`); the egress door of a
//! long-lived sandbox is a unix socket bound into the sandbox (`--host-uds=open`) that the agent bridges to
//! `127.0.0.1:3128` inside. A plan without a door (a local one-shot run: no network at all) gets neither the bind
//! nor `--host-uds`.
//!
//! Host-side limits: `runsc run` is placed in the sandbox's cgroup before it executes (`--ignore-cgroups`, so runsc
//! itself touches no cgroup), so the Sentry, the gofer and everything they start are charged to and killed with it.
//! Steps: record → cgroup → bundle → runsc (in the cgroup) → plan → ready.

#![allow(unsafe_code)]

mod bundle;
mod cleanup;

use std::ffi::CString;
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use sandkasten_jail::rootfs::RealHostFs;
use sandkasten_protocol::{AgentPlan, Envelope, Message, read_frame, write_frame};
use sandkasten_types::{SandboxFile, SandboxSpec};

pub(crate) use bundle::{DOOR_SOCKET, DOOR_SOCKET_INSIDE};
pub(crate) use cleanup::GvisorFiles;
pub use cleanup::{leftover_candidates, remove_leftovers};

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
    use std::os::unix::fs::PermissionsExt;
    let program = &config.gvisor.runsc;
    let executable = |path: &Path| path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if program.components().count() > 1 {
        return executable(program).then(|| program.clone());
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths).map(|dir| dir.join(program)).find(|candidate| executable(candidate))
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
}

impl<'a> GvisorTier<'a> {
    /// The tier with `config`'s runsc, starting `agent` in every sandbox; finds out whether runsc is installed.
    pub(crate) fn new(config: &'a RuntimeConfig, agent: &'a Path) -> GvisorTier<'a> {
        let missing = (!runsc_installed(config)).then(|| runsc_missing(config));
        GvisorTier { config, agent, missing }
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
}

/// Starts the gVisor sandbox `id` for `spec` (its root `files`, the agent's `plan`) into the allocated `guard` (record and cgroup exist) and returns the
/// host end of its agent channel once the agent serves. On error the guard (dropped by the caller) removes everything.
fn spawn(
    config: &RuntimeConfig,
    guard: &mut SandboxGuard,
    spec: &SandboxSpec,
    files: &[SandboxFile],
    plan: &AgentPlan,
    agent: &Path,
) -> Result<UnixStream, RuntimeError> {
    let home = plan.home.as_str();
    let bundle_dir = bundles_dir(config).join(&guard.id);
    guard.gvisor = Some(GvisorFiles {
        runsc: config.gvisor.runsc.clone(),
        runsc_root: runsc_root(config),
        bundle: bundle_dir.clone(),
    });
    std::fs::create_dir_all(&bundle_dir)
        .map_err(|e| RuntimeError::sys_owned(format!("creating {}", bundle_dir.display()), e))?;
    let bundle_spec = bundle::BundleSpec {
        home,
        disk_bytes: spec.limits.disk_bytes,
        files,
        uid: plan.uid,
        gid: plan.gid,
        agent,
        door: plan.door.is_some(),
    };
    let read_only = bundle::write(&bundle_dir, &bundle_spec, &RealHostFs)?;
    let read_only: Vec<CString> = read_only
        .into_iter()
        .filter_map(|path| CString::new(path.into_os_string().into_encoded_bytes()).ok())
        .collect();

    let (mut channel, agent_end) = UnixStream::pair().map_err(|e| RuntimeError::sys("socketpair", e))?;
    let log_path = bundle_dir.join("runsc.log");
    let log = std::fs::File::create(&log_path)
        .map_err(|e| RuntimeError::sys_owned(format!("creating {}", log_path.display()), e))?;
    let procs: Vec<CString> = guard
        .cgroup()?
        .paths()
        .iter()
        .filter_map(|dir| CString::new(dir.join("cgroup.procs").into_os_string().into_encoded_bytes()).ok())
        .collect();
    let runsc = resolve_runsc(config).ok_or_else(|| RuntimeError::HostUnsupported(runsc_missing(config)))?;
    let mut command = Command::new(&runsc);
    command
        .arg(format!("--root={}", runsc_root(config).display()))
        .arg("--network=none")
        .arg(format!("--platform={}", config.gvisor.platform.name()))
        .arg("--ignore-cgroups")
        // The Sentry may connect to host unix sockets bound into the sandbox only where there is one: the door.
        .args(plan.door.is_some().then_some("--host-uds=open"))
        .arg("--overlay2=none")
        .args(["run", "--bundle"])
        .arg(&bundle_dir)
        .arg(&guard.id)
        // Nothing of the owner's environment (API keys, tokens) may reach runsc or the gofer, host processes in the
        // sandbox's cgroup.
        .env_clear()
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(agent_end)))
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .process_group(0);
    // SAFETY: the closure runs in the forked child before execve and only makes async-signal-safe calls (open,
    // write, close, prctl, unshare, mount) on data prepared before the fork.
    unsafe {
        command.pre_exec(move || {
            join_cgroup_and_die_with_parent(&procs)?;
            read_only_sources(&read_only)
        });
    }
    let spawned = command.spawn();
    // The command holds the container's end of the channel: drop it now, or a runsc that dies at once would leave
    // the channel open and be noticed only at the ready timeout.
    drop(command);
    let child = spawned.map_err(|e| {
        RuntimeError::sys_owned(format!("starting {} (install it with scripts/setup.sh)", runsc.display()), e)
    })?;
    guard.init_pid = Some(child.id());
    // The child is reaped by whoever owns the guard (waitpid on `init_pid`), not through `Child`.
    drop(child);

    write_frame(&mut channel, &Envelope::new(0, Message::Plan { plan: plan.clone() }))?;
    wait_until_ready(&mut channel, &log_path)?;
    Ok(channel)
}

/// In the forked child: joins every cgroup directory of the sandbox (writing 0 = "this process"), then asks for
/// SIGKILL when the parent (the spawner, or the one-shot CLI) dies.
fn join_cgroup_and_die_with_parent(procs: &[CString]) -> std::io::Result<()> {
    for path in procs {
        // SAFETY: open/write/close on a NUL-terminated path prepared before the fork; async-signal-safe.
        let ok = unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            let written = fd >= 0 && libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
            if fd >= 0 {
                libc::close(fd);
            }
            written
        };
        if !ok {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// In the forked child, before runsc executes: a mount namespace of its own in which every host path the sandbox
/// binds is read-only at the host kernel's level (a bind onto itself, remounted read-only), so neither the gofer nor
/// a compromised Sentry can open one for writing. Nothing is mounted in the host's namespace: the namespace and
/// its mounts end with runsc's processes.
fn read_only_sources(paths: &[CString]) -> std::io::Result<()> {
    let fail = || Err(std::io::Error::last_os_error());
    // SAFETY: unshare and mount take NUL-terminated paths prepared before the fork (or null) and integer flags;
    // they are async-signal-safe system calls.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return fail();
        }
        let root = c"/";
        if libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            return fail();
        }
        for path in paths {
            let bind = libc::MS_BIND | libc::MS_REC;
            if libc::mount(path.as_ptr(), path.as_ptr(), std::ptr::null(), bind, std::ptr::null()) != 0 {
                return fail();
            }
            let read_only = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
            if libc::mount(std::ptr::null(), path.as_ptr(), std::ptr::null(), read_only, std::ptr::null()) != 0 {
                return fail();
            }
        }
    }
    Ok(())
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
fn last_words(log_path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut file) = std::fs::File::open(log_path) {
        let _ = file.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().filter(|line| !line.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(3)..].join("; ");
    if tail.is_empty() { "the sandbox exited before its agent answered (runsc said nothing)".to_owned() } else { tail }
}
