//! Launching a sandbox's agent: record → cgroup → socketpair → clone into new namespaces → id maps → `Start` →
//! cgroup attach → `CgroupJoined`. Shared by the one-shot path (`process_backend`) and the spawner of long-lived
//! sandboxes. Must run in a single-threaded process (the clone has fork semantics).

#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use sandkasten_agent::{AgentMode, InitPlan, run_init};
use sandkasten_cgroups::{Cgroup, CgroupError, CgroupLimits, Hierarchy};
use sandkasten_jail::namespaces::{self, CloneOutcome};
use sandkasten_jail::process::{ProcessJail, Stdio};
use sandkasten_jail::rlimits::ProcessRlimits;
use sandkasten_jail::rootfs::RootfsSpec;
use sandkasten_jail::seccomp::SandboxFilter;
use sandkasten_protocol::{Envelope, Message, write_frame};
use sandkasten_types::SandboxSpec;

use crate::config::RuntimeConfig;
use crate::error::RuntimeError;
use crate::guard::SandboxGuard;
use crate::plan::{RunPlan, SANDBOX_GID, SANDBOX_UID, user_of};

/// What a launch needs from its owner, prepared once.
pub(crate) struct Launcher<'a> {
    pub(crate) config: &'a RuntimeConfig,
    pub(crate) hierarchy: &'a Hierarchy,
    pub(crate) filter: &'a SandboxFilter,
}

/// A running agent (its pid is in the guard), its host end of the protocol channel, and the guard that owns its
/// resources.
pub(crate) struct LaunchedAgent {
    pub(crate) guard: SandboxGuard,
    pub(crate) channel: UnixStream,
}

fn cgroup_limits(spec: &SandboxSpec) -> CgroupLimits {
    const PERIOD_US: u64 = 100_000;
    CgroupLimits {
        memory_bytes: Some(spec.limits.memory_bytes),
        pids_max: Some(spec.limits.pids),
        cpu_quota_us: Some(((spec.limits.cpus * PERIOD_US as f64).round() as u64).max(1_000)),
        cpu_period_us: PERIOD_US,
    }
}

/// This process's OOM score adjustment (0 when unreadable).
fn own_oom_score_adj() -> i32 {
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
    /// returned guard. `allocated` is called when they do (for the phase timings).
    pub(crate) fn allocate(&self, id: &str, spec: &SandboxSpec) -> Result<SandboxGuard, RuntimeError> {
        let mut guard = SandboxGuard::record(self.config, id, spec.tier())?;
        guard.cgroup = Some(self.create_cgroup(id, &cgroup_limits(spec))?);
        Ok(guard)
    }

    /// Clones the agent into new namespaces with `plan` and brings it to the point where it runs what it was given.
    /// `stdio` are the descriptors the program (one-shot) inherits; the caller closes its copies afterwards.
    pub(crate) fn launch(
        &self,
        mut guard: SandboxGuard,
        spec: &SandboxSpec,
        plan: RunPlan,
        mode: AgentMode,
        stdio: Stdio,
    ) -> Result<LaunchedAgent, RuntimeError> {
        let (host_channel, agent_channel) = UnixStream::pair().map_err(|e| RuntimeError::sys("socketpair", e))?;
        let limits = &spec.limits;
        let workspace = Path::new(user_of(spec.template).home);
        let tmp = Path::new("/tmp");
        let init_plan = InitPlan {
            rootfs: RootfsSpec {
                new_root: PathBuf::from("/tmp"),
                home: workspace.into(),
                disk_bytes: limits.disk_bytes,
                sandbox_uid: SANDBOX_UID,
                sandbox_gid: SANDBOX_GID,
                files: plan.files,
            },
            uploads: plan.uploads,
            hostname: "sandbox".to_owned(),
            mode,
            compile: plan.compile,
            program: plan.program,
            env: plan.env,
            jail: ProcessJail {
                uid: SANDBOX_UID,
                gid: SANDBOX_GID,
                rlimits: ProcessRlimits::for_disk(limits.disk_bytes),
                writable_dirs: vec![workspace.into(), tmp.into(), "/dev/shm".into()],
                writable_files: ["/dev/null", "/dev/zero", "/dev/full", "/dev/tty"].map(PathBuf::from).to_vec(),
                cwd: workspace.into(),
                filter: self.filter,
                oom_score_adj: own_oom_score_adj(),
            },
            stdio,
            writable_mounts: vec![workspace, tmp, Path::new("/dev/shm")],
        };

        let pid = match namespaces::clone_into_namespaces(self.config.host_id_base)? {
            CloneOutcome::Child => {
                drop(host_channel);
                // The agent keeps only its channel and the program's streams: nothing else the owner had open (its
                // terminal, its end of the stdin pipe, other sandboxes' channels in a spawner) may live on in here.
                let keep = [agent_channel.as_raw_fd(), stdio.stdin, stdio.stdout, stdio.stderr];
                close_all_except(&keep);
                // A panic must never unwind into the owner's code in this copy of its memory (the guard's destructor
                // would remove the sandbox from inside it): end the agent instead.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    run_init(&init_plan, agent_channel.into())
                }));
                // SAFETY: _exit ends the forked child without running the owner's destructors.
                unsafe { libc::_exit(1) }
            }
            CloneOutcome::Parent(pid) => pid,
        };
        guard.init_pid = Some(pid);
        drop(agent_channel);

        namespaces::write_id_maps(pid, self.config.host_id_base)?;
        // The agent must outlive its children so it can report; the OOM killer picks the program instead. Lowering
        // needs CAP_SYS_RESOURCE, which some hosts' root lacks: then the result still reports the memory limit.
        if let Err(error) = std::fs::write(format!("/proc/{pid}/oom_score_adj"), "-1000") {
            tracing::debug!(%error, "could not protect the agent from the OOM killer");
        }
        let mut channel = host_channel;
        write_frame(&mut channel, &Envelope::new(0, Message::Start))?;
        // The agent builds its filesystem meanwhile; it runs nothing of the caller's before `CgroupJoined`.
        guard.cgroup()?.add_process(pid)?;
        write_frame(&mut channel, &Envelope::new(0, Message::CgroupJoined))?;
        Ok(LaunchedAgent { guard, channel })
    }
}
