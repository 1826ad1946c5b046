//! One-shot runs (`sandkasten run`) on any tier. On the process tier the host side of one execution is an ordered
//! list of steps — plan → record → cgroup → pipes → clone → id maps + cgroup placement → start → wait → kill → reap →
//! usage → remove — with the program's streams as pipes straight from the agent (the fast path); on the other tiers
//! it is spawn → uploads → one exec → destroy over the agent protocol (`backend::oneshot`).

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use sandkasten_cgroups::Hierarchy;
use sandkasten_jail::seccomp::SandboxFilter;
use sandkasten_protocol::{AgentMode, monotonic_ns};
use sandkasten_types::{ExecRequest, ExecResult, SandboxSpec, Tier};

use super::gvisor::GvisorTier;
use super::process::ProcessTier;
use super::process::io_loop::{self, WaitEnd, Watched};
use super::process::launch::{self, AgentBinary, Launcher};
use super::process::result::{Outcome, build_result};
use super::process::stdin_pump::StdinPump;
use super::{backend_for, oneshot};
use crate::config::RuntimeConfig;
use crate::error::RuntimeError;
use crate::output::OutputSink;
use crate::plan;
use crate::{gc, ids};

/// Where the program's standard input comes from.
#[derive(Debug, Clone, Copy)]
pub enum StdinSource<'a> {
    /// Empty (`/dev/null` inside the sandbox).
    Empty,
    /// What the owner reads from this descriptor (the CLI's own standard input), copied through a pipe. A terminal
    /// is not forwarded (the program gets `/dev/null`).
    Inherit(BorrowedFd<'a>),
}

/// Runs one-shot executions (the host's checks, cgroup hierarchy and agent binary prepared once).
pub struct OneShotRunner {
    config: RuntimeConfig,
    hierarchy: Hierarchy,
    agent: AgentBinary,
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

impl OneShotRunner {
    /// Checks the host, detects its cgroup hierarchy and compiles the seccomp policy (once).
    pub fn new(config: RuntimeConfig) -> Result<OneShotRunner, RuntimeError> {
        check_host()?;
        let hierarchy = Hierarchy::detect().map_err(|e| {
            RuntimeError::HostUnsupported(format!(
                "no usable cgroup hierarchy ({e}): mount cgroup v2 or the v1 controllers"
            ))
        })?;
        // The agent compiles the seccomp policy itself; compiling it here too finds a broken policy before any
        // sandbox exists, with an error that says so.
        SandboxFilter::compile().map_err(sandkasten_jail::JailError::from)?;
        let agent = AgentBinary::open(&config)?;
        Ok(OneShotRunner { config, hierarchy, agent })
    }

    /// The detected cgroup hierarchy.
    pub fn hierarchy(&self) -> &Hierarchy {
        &self.hierarchy
    }

    /// The runtime configuration.
    pub fn config(&self) -> &RuntimeConfig {
        &self.config
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
        // Every other tier (and the refusal of one this build cannot run: `backend_for`) goes over the protocol.
        if spec.tier() != Tier::Process {
            return self.run_over_protocol(spec, request, stdin, sink, started_ns);
        }
        let mut run_plan = plan::plan(spec, request)?;
        self.collect_stale();
        let id = ids::new_sandbox_id()?;
        let launcher = Launcher { config: &self.config, hierarchy: &self.hierarchy, agent: &self.agent };
        let guard = launcher.allocate(&id, spec)?;
        let allocated_ns = monotonic_ns();

        let (stdout_read, stdout_write) = pipe()?;
        let (stderr_read, stderr_write) = pipe()?;
        // The program gets a pipe, never the owner's descriptor (see `stdin_pump`); a terminal is not forwarded.
        let (stdin_fd, pump): (OwnedFd, Option<StdinPump>) = match stdin {
            StdinSource::Inherit(fd) if !rustix::termios::isatty(fd) => {
                let (read_end, write_end) = pipe()?;
                let source = fd.try_clone_to_owned().map_err(|e| RuntimeError::sys("dup stdin", e))?;
                (read_end, Some(StdinPump::new(source, write_end)?))
            }
            _ => (std::fs::File::open("/dev/null").map_err(|e| RuntimeError::sys("open /dev/null", e))?.into(), None),
        };
        let (signals, previous_mask) = io_loop::block_stop_signals()?;
        let _restore = RestoreMask(previous_mask);
        let inherit = [stdin_fd.as_raw_fd(), stdout_write.as_raw_fd(), stderr_write.as_raw_fd()];
        let uploads = std::mem::take(&mut run_plan.uploads);
        let mode = AgentMode::OneShot {
            compile: run_plan.compile.take(),
            program: std::mem::take(&mut run_plan.program),
            stdio: inherit,
        };
        let agent_plan = plan::agent_plan(spec, run_plan, mode, launch::own_oom_score_adj());
        let mut guard = guard;
        let channel = launcher.launch(&mut guard, &agent_plan, &uploads, &inherit)?;
        drop((stdout_write, stderr_write, stdin_fd));
        let limits = &spec.limits;

        let deadline_ns = started_ns.saturating_add(limits.timeout_ms.saturating_mul(1_000_000));
        let watched =
            Watched { stdout: stdout_read, stderr: stderr_read, channel: channel.into(), signals, stdin: pump };
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

impl OneShotRunner {
    /// Removes what crashed runs left behind, when records say there is something (cheap otherwise).
    fn collect_stale(&self) {
        if gc::has_stale_records(&self.config)
            && let Err(error) = gc::collect(&self.config, &self.hierarchy)
        {
            tracing::warn!(%error, "garbage collection of stale sandboxes failed");
        }
    }

    /// A one-shot run on a tier other than the process tier: the same agent protocol as a long-lived sandbox
    /// (`backend::oneshot`).
    fn run_over_protocol(
        &self,
        spec: &SandboxSpec,
        request: &ExecRequest,
        stdin: StdinSource<'_>,
        sink: &mut dyn OutputSink,
        started_ns: u64,
    ) -> Result<ExecResult, RuntimeError> {
        let launcher = Launcher { config: &self.config, hierarchy: &self.hierarchy, agent: &self.agent };
        let gvisor = GvisorTier::new(&self.config, &self.agent.path);
        let process = ProcessTier { launcher: Launcher { ..launcher } };
        let backend = backend_for(spec.tier(), &process, &gvisor)?;
        self.collect_stale();
        let result = oneshot::run(spec, request, stdin, sink, started_ns, |run_plan| {
            let id = ids::new_sandbox_id()?;
            let mut guard = launcher.allocate(&id, spec)?;
            let mut agent_plan =
                plan::agent_plan(spec, run_plan.clone(), AgentMode::Serve, launch::own_oom_score_adj());
            // A local run has no network at all (no egress proxy listens on the host): no door to open.
            agent_plan.door = None;
            let channel = backend.spawn(&mut guard, spec, &run_plan.files, &agent_plan)?;
            Ok((guard, channel))
        });
        let _ = self.hierarchy.remove_parent(&self.config.cgroup_parent);
        result
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
