//! The `process` tier: namespaces + pivot_root + seccomp + landlock + cgroups, set up by `sandkasten-jail` and run
//! by the agent as PID 1. This file is the host side of one execution, as an ordered list of steps:
//! plan → record → cgroup → pipes → clone → id maps + cgroup placement → start → wait → kill → reap → usage → remove.

#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use sandkasten_agent::{InitPlan, run_init};
use sandkasten_cgroups::{Cgroup, CgroupLimits, Hierarchy};
use sandkasten_jail::namespaces::{self, CloneOutcome};
use sandkasten_jail::process::{ProcessJail, Stdio};
use sandkasten_jail::rlimits::ProcessRlimits;
use sandkasten_jail::rootfs::RootfsSpec;
use sandkasten_jail::seccomp::SandboxFilter;
use sandkasten_protocol::{Envelope, Message, monotonic_ns, write_frame};
use sandkasten_types::{ExecRequest, ExecResult, SandboxSpec};

use crate::backend::Backend;
use crate::config::RuntimeConfig;
use crate::error::RuntimeError;
use crate::io_loop::{self, WaitEnd, Watched};
use crate::output::OutputSink;
use crate::plan::{self, SANDBOX_GID, SANDBOX_UID, WORKSPACE};
use crate::records::{RecordStore, SandboxRecord};
use crate::result::{Outcome, build_result};
use crate::{gc, ids};

/// Where the program's standard input comes from.
#[derive(Debug, Clone, Copy)]
pub enum StdinSource<'a> {
    /// Empty (`/dev/null` inside the sandbox).
    Empty,
    /// A descriptor of the owner (the CLI's own standard input), passed through.
    Inherit(BorrowedFd<'a>),
}

/// The process tier.
pub struct ProcessBackend {
    config: RuntimeConfig,
    hierarchy: Hierarchy,
    filter: SandboxFilter,
}

fn check_host() -> Result<(), RuntimeError> {
    if !rustix::process::geteuid().is_root() {
        return Err(RuntimeError::HostUnsupported(
            "the process tier needs root to create cgroups and map sandbox ids: run sandkasten as root (sudo)".into(),
        ));
    }
    let max_namespaces = std::fs::read_to_string("/proc/sys/user/max_user_namespaces").unwrap_or_default();
    if max_namespaces.trim() == "0" {
        return Err(RuntimeError::HostUnsupported(
            "user namespaces are disabled (user.max_user_namespaces = 0): enable them with \
             `sysctl -w user.max_user_namespaces=15000`"
                .into(),
        ));
    }
    Ok(())
}

impl ProcessBackend {
    /// Checks the host, detects its cgroup hierarchy and compiles the seccomp policy (once).
    pub fn new(config: RuntimeConfig) -> Result<ProcessBackend, RuntimeError> {
        check_host()?;
        let hierarchy = Hierarchy::detect().map_err(|e| {
            RuntimeError::HostUnsupported(format!("no usable cgroup hierarchy ({e}): mount cgroup v2 or the v1 controllers"))
        })?;
        let filter = SandboxFilter::compile().map_err(sandkasten_jail::JailError::from)?;
        Ok(ProcessBackend { config, hierarchy, filter })
    }

    /// The detected cgroup hierarchy.
    pub fn hierarchy(&self) -> &Hierarchy {
        &self.hierarchy
    }

    /// The runtime configuration.
    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    /// Creates the sandbox's cgroup. A concurrent run may remove the shared (empty) parent between our creating it
    /// and creating the child: that shows as ENOENT and is retried.
    fn create_cgroup(&self, id: &str, limits: &CgroupLimits) -> Result<Cgroup, RuntimeError> {
        let mut attempts = 0;
        loop {
            match self.hierarchy.create(&self.config.cgroup_parent, id, limits) {
                Err(sandkasten_cgroups::CgroupError::CreateDir { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound && attempts < 5 =>
                {
                    attempts += 1;
                }
                other => return Ok(other?),
            }
        }
    }

    /// Runs one execution with the program's stdin taken from `stdin`.
    pub fn run_with_stdin(
        &self,
        spec: &SandboxSpec,
        request: &ExecRequest,
        stdin: StdinSource<'_>,
        sink: &mut dyn OutputSink,
        started_ns: u64,
    ) -> Result<ExecResult, RuntimeError> {
        let plan = plan::plan(spec, request)?;
        if gc::has_stale_records(&self.config)
            && let Err(error) = gc::collect(&self.config, &self.hierarchy)
        {
            tracing::warn!(%error, "garbage collection of stale sandboxes failed");
        }
        let id = ids::new_sandbox_id()?;
        let mut guard = SandboxGuard::record(&self.config, &id)?;
        let limits = &spec.limits;
        guard.cgroup = Some(self.create_cgroup(&id, &cgroup_limits(spec))?);
        let allocated_ns = monotonic_ns();

        let (stdout_read, stdout_write) = pipe()?;
        let (stderr_read, stderr_write) = pipe()?;
        let (host_channel, agent_channel) =
            UnixStream::pair().map_err(|e| RuntimeError::sys("socketpair", e))?;
        let stdin_fd: OwnedFd = match stdin {
            StdinSource::Inherit(fd) => fd.try_clone_to_owned().map_err(|e| RuntimeError::sys("dup stdin", e))?,
            StdinSource::Empty => std::fs::File::open("/dev/null").map_err(|e| RuntimeError::sys("open /dev/null", e))?.into(),
        };
        let (signals, previous_mask) = io_loop::block_stop_signals()?;
        let _restore = RestoreMask(previous_mask);

        let workspace = Path::new(WORKSPACE);
        let tmp = Path::new("/tmp");
        let init_plan = InitPlan {
            rootfs: RootfsSpec {
                new_root: PathBuf::from("/tmp"),
                disk_bytes: limits.disk_bytes,
                sandbox_uid: SANDBOX_UID,
                sandbox_gid: SANDBOX_GID,
                files: plan.files,
            },
            uploads: plan.uploads,
            hostname: "sandbox".to_owned(),
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
                filter: &self.filter,
            },
            stdio: Stdio {
                stdin: stdin_fd.as_raw_fd(),
                stdout: stdout_write.as_raw_fd(),
                stderr: stderr_write.as_raw_fd(),
            },
            writable_mounts: vec![workspace, tmp],
        };

        let pid = match namespaces::clone_into_namespaces()? {
            CloneOutcome::Child => {
                drop(host_channel);
                // A panic must never unwind into the host's code in this copy of its memory (the guard's destructor
                // would remove the sandbox from inside it): end the agent instead.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    run_init(&init_plan, agent_channel.into())
                }));
                // SAFETY: _exit ends the forked child without running the host's destructors.
                unsafe { libc::_exit(1) }
            }
            CloneOutcome::Parent(pid) => pid,
        };
        guard.init_pid = Some(pid);
        drop((agent_channel, stdout_write, stderr_write, stdin_fd));

        namespaces::write_id_maps(pid, self.config.host_id_base)?;
        // The agent must outlive its children so it can report; the OOM killer picks the program instead. Lowering
        // needs CAP_SYS_RESOURCE, which some hosts' root lacks: then the result still reports the memory limit.
        if let Err(error) = std::fs::write(format!("/proc/{pid}/oom_score_adj"), "-1000") {
            tracing::debug!(%error, "could not protect the agent from the OOM killer");
        }
        let mut host_channel = host_channel;
        write_frame(&mut host_channel, &Envelope::new(0, Message::Start))?;
        // The agent builds its filesystem meanwhile; it runs nothing of the caller's before `CgroupJoined`.
        guard.cgroup()?.add_process(pid)?;
        write_frame(&mut host_channel, &Envelope::new(0, Message::CgroupJoined))?;

        let deadline_ns = started_ns.saturating_add(limits.timeout_ms.saturating_mul(1_000_000));
        let watched = Watched { stdout: stdout_read, stderr: stderr_read, channel: host_channel.into(), signals };
        let (end, observed) = io_loop::wait(watched, limits.output_bytes, deadline_ns, sink)?;
        let finished_ns = monotonic_ns();
        if end != WaitEnd::Finished {
            guard.kill();
        }
        guard.reap();
        let usage = guard.cgroup()?.usage()?;
        guard.release()?;
        // The shared parent goes when the last sandbox does (ENOTEMPTY while others run: fine).
        let _ = self.hierarchy.remove_parent(&self.config.cgroup_parent);
        if let WaitEnd::Interrupted(signal) = end {
            return Err(RuntimeError::Interrupted(signal));
        }
        Ok(build_result(Outcome { id, end, observed, usage, started_ns, allocated_ns, finished_ns }))
    }
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

fn pipe() -> Result<(OwnedFd, OwnedFd), RuntimeError> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| RuntimeError::sys("pipe2", e))
}

struct RestoreMask(libc::sigset_t);

impl Drop for RestoreMask {
    fn drop(&mut self) {
        io_loop::restore_signal_mask(&self.0);
    }
}

/// Owns a sandbox's host resources from the moment its record is written: whatever path the run takes (error,
/// panic, early return), dropping the guard kills what runs, removes the cgroup and then the record.
struct SandboxGuard {
    store: RecordStore,
    id: String,
    cgroup: Option<Cgroup>,
    init_pid: Option<u32>,
}

impl SandboxGuard {
    fn record(config: &RuntimeConfig, id: &str) -> Result<SandboxGuard, RuntimeError> {
        let store = RecordStore::new(config.records_dir());
        store.write(&SandboxRecord::owned_by_me(id, "process", &config.cgroup_parent))?;
        Ok(SandboxGuard { store, id: id.to_owned(), cgroup: None, init_pid: None })
    }

    fn cgroup(&self) -> Result<&Cgroup, RuntimeError> {
        self.cgroup.as_ref().ok_or_else(|| RuntimeError::InvalidInput("the sandbox's cgroup is gone".into()))
    }

    fn kill(&self) {
        if let Some(cgroup) = &self.cgroup
            && let Err(error) = cgroup.kill_all()
        {
            tracing::warn!(%error, sandbox = %self.id, "killing the sandbox's cgroup failed");
        }
        if let Some(pid) = self.init_pid {
            // SAFETY: kill(2) with a pid we created and have not reaped yet, so it cannot be recycled.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
    }

    fn reap(&mut self) {
        if let Some(pid) = self.init_pid.take() {
            let mut status = 0;
            // SAFETY: waitpid on our own child, writing into an owned integer.
            while unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) } < 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
            {}
        }
    }

    /// Removes the cgroup, then the record.
    fn release(&mut self) -> Result<(), RuntimeError> {
        if let Some(cgroup) = self.cgroup.take() {
            cgroup.remove()?;
        }
        self.store.remove(&self.id)
    }
}

impl Drop for SandboxGuard {
    fn drop(&mut self) {
        if self.init_pid.is_some() {
            self.kill();
            self.reap();
        }
        if let Err(error) = self.release() {
            tracing::error!(%error, sandbox = %self.id, "releasing the sandbox failed; `sandkasten gc` will retry");
        }
    }
}

impl Backend for ProcessBackend {
    fn name(&self) -> &'static str {
        "process"
    }

    fn run_once(
        &self,
        spec: &SandboxSpec,
        request: &ExecRequest,
        sink: &mut dyn OutputSink,
        started_ns: u64,
    ) -> Result<ExecResult, RuntimeError> {
        self.run_with_stdin(spec, request, StdinSource::Empty, sink, started_ns)
    }
}
