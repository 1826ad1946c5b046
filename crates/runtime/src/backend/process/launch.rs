//! Launching a process-tier sandbox's agent: record → cgroup → socketpair → clone into new namespaces → id maps →
//! `Start` + `Plan` → cgroup attach → `CgroupJoined`. The cloned child is a tiny starter: it waits for `Start` (the id
//! maps exist then), becomes its user namespace's root, arms the parent-death signal and executes the agent binary
//! (`sandkasten agent`, channel on descriptor 0), which reads its plan from the channel. Used by one-shot runs and by
//! the spawner of long-lived sandboxes alike (through `ProcessTier`). Must run in a single-threaded process (the
//! clone has fork semantics).

#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use sandkasten_cgroups::{Cgroup, CgroupError, CgroupLimits, Hierarchy};
use sandkasten_jail::namespaces::{self, CloneOutcome};
use sandkasten_protocol::{AgentPlan, Envelope, Message, read_frame, write_frame};
use sandkasten_types::{SandboxSpec, Tier};

use crate::config::RuntimeConfig;
use crate::error::RuntimeError;
use crate::guard::SandboxGuard;
use crate::id_ranges::IdRange;

/// What a launch needs from its owner, prepared once.
#[derive(Clone, Copy)]
pub(crate) struct Launcher<'a> {
    pub(crate) config: &'a RuntimeConfig,
    pub(crate) hierarchy: &'a Hierarchy,
    /// The agent executable, opened once (`O_PATH`): the starter executes it through this descriptor.
    pub(crate) agent: &'a AgentBinary,
}

/// The agent executable: its path (bound into gVisor sandboxes) and a descriptor of it (executed by the process
/// tier's starter, so the path need not be reachable from inside the new namespaces).
#[derive(Debug)]
pub(crate) struct AgentBinary {
    pub(crate) path: PathBuf,
    fd: std::os::fd::OwnedFd,
}

impl AgentBinary {
    /// Opens the configured agent binary, or this process's own executable (the `sandkasten` binary).
    pub(crate) fn open(config: &RuntimeConfig) -> Result<AgentBinary, RuntimeError> {
        let path = match &config.agent_program {
            Some(path) => path.clone(),
            None => std::env::current_exe().map_err(|e| RuntimeError::sys("finding the agent binary", e))?,
        };
        let fd =
            rustix::fs::open(&path, rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
                .map_err(|e| {
                    RuntimeError::sys_owned(format!("opening the agent binary {}", path.display()), e.into())
                })?;
        Ok(AgentBinary { path, fd })
    }
}

/// Host tasks a gVisor sandbox may use beyond its process limit: the Sentry's and the gofer's threads and the
/// platform's stub processes are host tasks of the sandbox's cgroup, while its own processes are counted inside
/// (`RLIMIT_NPROC`).
const GVISOR_PIDS_HEADROOM: u64 = 256;

fn cgroup_limits(spec: &SandboxSpec) -> CgroupLimits {
    const PERIOD_US: u64 = 100_000;
    let host_pids = match spec.tier() {
        sandkasten_types::Tier::Gvisor => spec.limits.pids.saturating_add(GVISOR_PIDS_HEADROOM),
        // The guest's processes are the guest kernel's; on the host there are the VMM's threads only.
        sandkasten_types::Tier::Microvm => crate::backend::microvm::VMM_HOST_TASKS,
        _ => spec.limits.pids,
    };
    let memory_bytes = match spec.tier() {
        // The guest's RAM is the memory limit; the VMM's own memory comes on top, bounded too.
        sandkasten_types::Tier::Microvm => {
            spec.limits.memory_bytes.saturating_add(crate::backend::microvm::VMM_OVERHEAD_BYTES)
        }
        _ => spec.limits.memory_bytes,
    };
    CgroupLimits {
        memory_bytes: Some(memory_bytes),
        pids_max: Some(host_pids),
        cpu_quota_us: Some(((spec.limits.cpus * PERIOD_US as f64).round() as u64).max(1_000)),
        cpu_period_us: PERIOD_US,
    }
}

/// This process's OOM score adjustment (0 when unreadable).
pub(crate) fn own_oom_score_adj() -> i32 {
    std::fs::read_to_string("/proc/self/oom_score_adj").ok().and_then(|text| text.trim().parse().ok()).unwrap_or(0)
}

/// Closes every descriptor from 3 up except those in `keep`, and points 0–2 at `/dev/null` unless kept.
fn close_all_except(keep: &[RawFd]) {
    let mut kept: Vec<RawFd> = keep.iter().copied().filter(|fd| *fd > 2).collect();
    kept.sort_unstable();
    kept.dedup();
    let mut next: RawFd = 3;
    for fd in kept.iter().copied().chain(std::iter::once(RawFd::MAX)) {
        if fd > next {
            // SAFETY: close_range(2) on descriptors this forked child does not use; plain integers.
            unsafe { libc::syscall(libc::SYS_close_range, next as libc::c_uint, (fd - 1) as libc::c_uint, 0) };
        }
        next = fd.saturating_add(1);
    }
    if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
        for fd in 0..=2 {
            if !keep.contains(&fd) {
                // SAFETY: dup2 onto a standard descriptor of this process.
                unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), fd) };
            }
        }
    }
}

impl Launcher<'_> {
    /// Creates the sandbox's cgroup. A concurrent run may remove the shared (empty) parent between our creating it
    /// and creating the child: that shows as ENOENT and is retried.
    fn create_cgroup(&self, id: &str, limits: &CgroupLimits) -> Result<Cgroup, RuntimeError> {
        let mut attempts = 0;
        loop {
            match self.hierarchy.create(&self.config.cgroup_parent, id, limits) {
                Err(CgroupError::CreateDir { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound && attempts < 5 =>
                {
                    attempts += 1;
                }
                other => return Ok(other?),
            }
        }
    }

    /// Writes the record and creates the cgroup: the sandbox's host resources exist from here on, owned by the
    /// returned guard.
    pub(crate) fn allocate(&self, id: &str, spec: &SandboxSpec) -> Result<SandboxGuard, RuntimeError> {
        // A template's layer that is gone (its template removed and collected since this spec was made, e.g. for a
        // snapshot) would leave the sandbox without the template's files and no word said.
        if let Some(missing) = spec.layers.layers.iter().find(|layer| !layer.is_dir()) {
            let template = spec.layers.name.as_deref().unwrap_or("the sandbox's template");
            return Err(RuntimeError::InvalidInput(format!(
                "{template}'s layer {} is gone (the template was removed since): build the template again",
                missing.display()
            )));
        }
        // A process-tier sandbox maps its ids to a host range of its own (per-user kernel quotas are per sandbox).
        let id_range = match spec.tier() {
            // A microVM's VMM runs in a process-tier jail of its own, under the sandbox's host ids.
            Tier::Process | Tier::Microvm => {
                Some(IdRange::claim(&self.config.state_dir, &self.config.records_dir(), self.config.host_id_base)?)
            }
            _ => None,
        };
        let mut guard = SandboxGuard::record(self.config, id, spec.tier(), id_range, &spec.layers.layers)?;
        let limits = cgroup_limits(spec);
        guard.cgroup = Some(self.create_cgroup(id, &limits)?);
        guard.cgroup_limits = Some(limits);
        Ok(guard)
    }

    /// Creates the cgroup of a sandbox whose cgroup was removed while it kept living elsewhere (a gVisor sandbox
    /// paused by checkpoint, being restored), with the limits it was created with.
    pub(crate) fn recreate_cgroup(&self, guard: &mut SandboxGuard) -> Result<(), RuntimeError> {
        let limits = guard
            .cgroup_limits
            .clone()
            .ok_or_else(|| RuntimeError::InvalidInput(format!("sandbox {} has no cgroup limits", guard.id)))?;
        guard.cgroup = Some(self.create_cgroup(&guard.id, &limits)?);
        Ok(())
    }

    /// Clones the starter into new namespaces, which executes the agent with `plan`, and brings it to the point where
    /// it builds its root and serves (in the sandbox's cgroup).
    pub(crate) fn launch(&self, guard: &mut SandboxGuard, plan: &AgentPlan) -> Result<UnixStream, RuntimeError> {
        self.launch_keeping(guard, plan, &[])
    }

    /// `launch`, with the descriptors in `keep` inherited by the agent (under the same numbers): what a VMM's jail
    /// passes on to the VMM (`AgentPlan::vmm`).
    pub(crate) fn launch_keeping(
        &self,
        guard: &mut SandboxGuard,
        plan: &AgentPlan,
        keep: &[RawFd],
    ) -> Result<UnixStream, RuntimeError> {
        let (host_channel, agent_channel) = UnixStream::pair().map_err(|e| RuntimeError::sys("socketpair", e))?;
        let id_base = guard.id_range.as_ref().map_or(self.config.host_id_base, IdRange::base);
        // The agent (process tier: `agent::init`) of a template's sandbox expects its layer mounts after the plan.
        let layer_mounts = match &plan.template.capture {
            Some(capture) => {
                prepare_capture(capture, id_base, plan.uid, plan.gid)?;
                Some(layer_mounts(&plan.template.layers, id_base + plan.uid, id_base + plan.gid)?)
            }
            None if plan.template.layers.is_empty() => None,
            None => Some(layer_mounts(&plan.template.layers, id_base, id_base).unwrap_or_else(|error| {
                warn_plain_layers(&error);
                Vec::new()
            })),
        };
        let pid = match namespaces::clone_into_namespaces(id_base)? {
            CloneOutcome::Child => {
                drop(host_channel);
                // The starter keeps only its channel and the agent binary: nothing else the owner had open (its
                // terminal, other sandboxes' channels in a spawner) may live on in here.
                let mut kept = vec![agent_channel.as_raw_fd(), self.agent.fd.as_raw_fd()];
                kept.extend_from_slice(keep);
                close_all_except(&kept);
                for fd in keep {
                    // SAFETY: fcntl on a descriptor this child holds; the agent's execve must not close it.
                    unsafe { libc::fcntl(*fd, libc::F_SETFD, 0) };
                }
                // A panic must never unwind into the owner's code in this copy of its memory (the guard's destructor
                // would remove the sandbox from inside it): end the starter instead.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    start_agent(agent_channel, self.agent.fd.as_raw_fd())
                }));
                // SAFETY: _exit ends the forked child without running the owner's destructors.
                unsafe { libc::_exit(1) }
            }
            CloneOutcome::Parent(pid) => pid,
        };
        guard.init_pid = Some(pid);
        drop(agent_channel);

        namespaces::write_id_maps(pid, id_base)?;
        // The agent must outlive its children so it can report; the OOM killer picks the program instead. Lowering
        // needs CAP_SYS_RESOURCE, which some hosts' root lacks: then the result still reports the memory limit.
        if let Err(error) = std::fs::write(format!("/proc/{pid}/oom_score_adj"), "-1000") {
            tracing::debug!(%error, "could not protect the agent from the OOM killer");
        }
        let mut channel = host_channel;
        write_frame(&mut channel, &Envelope::new(0, Message::Start))?;
        write_frame(&mut channel, &Envelope::new(0, Message::Plan { plan: Box::new(plan.clone()) }))?;
        if let Some(layer_mounts) = layer_mounts {
            sandkasten_jail::idmap::send_fds(&channel, &layer_mounts)?;
        }
        // The agent builds its filesystem meanwhile; it runs nothing of the caller's before `CgroupJoined`.
        guard.cgroup()?.add_process(pid)?;
        write_frame(&mut channel, &Envelope::new(0, Message::CgroupJoined))?;
        Ok(channel)
    }
}

/// In the cloned child: waits for `Start` (the host has written the id maps then), becomes the user namespace's root,
/// arms the parent-death signal, puts the channel on descriptor 0 and executes the agent. Returns only if that failed
/// (after telling the host why).
fn start_agent(channel: UnixStream, agent: RawFd) {
    let mut channel = channel;
    let failure = (|| -> Result<(), String> {
        match read_frame(&mut channel) {
            Ok(Some(Envelope { msg: Message::Start, .. })) => {}
            Ok(_) | Err(_) => return Err("the host did not send start".to_owned()),
        }
        // Credentials change first: the kernel clears the parent-death signal on every change of ids, so it is armed
        // after becoming the namespace's root (and survives execve: the agent is neither set-id nor file-capable).
        namespaces::become_namespace_root().map_err(|e| e.to_string())?;
        namespaces::die_with_parent(0).map_err(|e| e.to_string())?;
        // SAFETY: dup2 onto descriptor 0 of this process (the copy loses close-on-exec). Integers only.
        if unsafe { libc::dup2(channel.as_raw_fd(), 0) } < 0 {
            return Err(format!("dup2 of the channel: {}", std::io::Error::last_os_error()));
        }
        let argv: [*const libc::c_char; 3] = [c"sandkasten".as_ptr(), c"agent".as_ptr(), std::ptr::null()];
        let envp: [*const libc::c_char; 1] = [std::ptr::null()];
        // SAFETY: argv and envp are null-terminated arrays of NUL-terminated static strings; the path is empty with
        // AT_EMPTY_PATH, so the descriptor itself is executed. On success the call does not return.
        unsafe {
            libc::syscall(libc::SYS_execveat, agent, c"".as_ptr(), argv.as_ptr(), envp.as_ptr(), libc::AT_EMPTY_PATH)
        };
        Err(format!("executing the agent: {}", std::io::Error::last_os_error()))
    })();
    if let Err(message) = failure {
        let _ = write_frame(&mut channel, &Envelope::new(0, Message::SetupFailed { message }));
    }
}

/// Says once per process (and each time at debug level) that a template's layers are mounted without an idmap (the
/// cache's filesystem cannot be idmapped, or the host refuses): their files are then the overflow user's inside.
fn warn_plain_layers(error: &RuntimeError) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    tracing::debug!(%error, "a sandbox's template layers mounted without an idmap");
    WARNED.call_once(|| {
        tracing::warn!(%error, "template layers cannot be idmapped here: their files show as the overflow user's");
    });
}

/// A template sandbox's lower layers as idmapped mounts (`sandkasten_jail::idmap`), in the order its overlay stacks
/// them: the layers' owner (the host's root) is host ids `uid`, `gid` through them: a build sandbox's user, so a
/// step can change what an earlier layer holds; else the sandbox's root, so the files are root's inside as on the
/// other tiers.
fn layer_mounts(layers: &[std::path::PathBuf], uid: u32, gid: u32) -> Result<Vec<std::os::fd::OwnedFd>, RuntimeError> {
    use sandkasten_jail::rootfs::{RealHostFs, template_lowers};
    use std::os::fd::AsFd;
    let lowers = template_lowers(layers, &RealHostFs);
    if lowers.is_empty() {
        return Ok(Vec::new());
    }
    let mapping = sandkasten_jail::idmap::owner_mapping(uid, gid)?;
    Ok(lowers.iter().map(|lower| sandkasten_jail::idmap::idmapped(lower, mapping.as_fd())).collect::<Result<_, _>>()?)
}

/// Makes a build sandbox's capture directory ready for its overlay: `upper/opt` owned by the sandbox user (its steps
/// write `/opt`), `upper` and `work` by the sandbox's root (the agent mounts the overlay), all as host ids of the
/// sandbox's range `id_base`.
fn prepare_capture(capture: &std::path::Path, id_base: u32, uid: u32, gid: u32) -> Result<(), RuntimeError> {
    use std::os::unix::fs::DirBuilderExt;
    let owned = |path: std::path::PathBuf, mode: u32, owner: (u32, u32)| -> Result<(), RuntimeError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(&path)
            .and_then(|()| std::os::unix::fs::chown(&path, Some(owner.0), Some(owner.1)))
            .map_err(|e| RuntimeError::sys_owned(format!("preparing the build capture {}", path.display()), e))
    };
    let root = (id_base, id_base);
    owned(capture.join("upper"), 0o755, root)?;
    owned(capture.join("upper/opt"), 0o755, (id_base + uid, id_base + gid))?;
    owned(capture.join("work"), 0o700, root)
}
