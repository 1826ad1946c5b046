//! One-shot runs (`sandkasten run`) on any tier: the host's checks, its cgroup hierarchy and the agent binary are
//! prepared once (`OneShotRunner::new`); each run is then the same as on a long-lived sandbox — the tier's backend
//! spawns the agent, one command runs over the agent protocol, the sandbox is destroyed (`backend::oneshot`).

use std::os::fd::BorrowedFd;

use sandkasten_cgroups::Hierarchy;
use sandkasten_jail::seccomp::SandboxFilter;
use sandkasten_types::{ExecRequest, ExecResult, SandboxSpec};

use super::process::launch::{AgentBinary, Launcher};
use super::{Tiers, backend_for, oneshot};
use crate::config::RuntimeConfig;
use crate::error::RuntimeError;
use crate::gc;
use crate::output::OutputSink;

/// Where the program's standard input comes from.
#[derive(Debug, Clone, Copy)]
pub enum StdinSource<'a> {
    /// Empty: the program reads end-of-file at once.
    Empty,
    /// What the owner reads from this descriptor (the CLI's own standard input), streamed to the program as it is
    /// read. A terminal is not forwarded (the program reads end-of-file).
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

    /// Why a run on `tier` cannot start on this host, if it cannot (what to install or configure); the same answers
    /// as the live runtime's.
    pub fn tier_unavailable(&self, tier: sandkasten_types::Tier) -> Option<String> {
        use sandkasten_types::Tier;
        match tier {
            Tier::Process => None,
            Tier::Gvisor => {
                (!super::gvisor::runsc_installed(&self.config)).then(|| super::gvisor::runsc_missing(&self.config))
            }
            Tier::Microvm => super::microvm::unusable(&self.config.microvm),
            Tier::Auto => tier.unavailable_reason().map(str::to_owned),
        }
    }

    /// The acceleration a microVM run would get here (as its backend chooses it).
    pub fn microvm_accel(&self) -> sandkasten_types::MicrovmAccel {
        super::microvm::accel(&self.config.microvm)
    }

    /// Runs one execution with the program's stdin taken from `stdin`: spawn → uploads → (compile) → one exec →
    /// destroy, over the agent protocol, on the tier `spec` names (`backend::oneshot`).
    pub fn run_with_stdin(
        &self,
        spec: &SandboxSpec,
        request: &ExecRequest,
        stdin: StdinSource<'_>,
        sink: &mut dyn OutputSink,
        started_ns: u64,
    ) -> Result<ExecResult, RuntimeError> {
        let launcher = Launcher { config: &self.config, hierarchy: &self.hierarchy, agent: &self.agent };
        let tiers = Tiers::new(launcher, false);
        let backend = backend_for(spec.tier(), &tiers)?;
        self.collect_stale();
        let result = oneshot::run(spec, request, stdin, sink, started_ns, &launcher, backend);
        // The shared parent goes when the last sandbox does (ENOTEMPTY while others run: fine).
        let _ = self.hierarchy.remove_parent(&self.config.cgroup_parent);
        result
    }

    /// Removes what crashed runs left behind, when records say there is something (cheap otherwise).
    fn collect_stale(&self) {
        if gc::has_stale_records(&self.config)
            && let Err(error) = gc::collect(&self.config, &self.hierarchy)
        {
            tracing::warn!(%error, "garbage collection of stale sandboxes failed");
        }
    }
}
