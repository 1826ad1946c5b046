//! `SandboxGuard`: owns a sandbox's host resources (record, id range, cgroup, agent process) from the moment its record is
//! written, so that every path — success, error, panic, early return — ends with nothing left on the host.

#![allow(unsafe_code)]

use sandkasten_cgroups::{Cgroup, CgroupLimits, Usage};

use sandkasten_types::Tier;

use crate::backend::gvisor::GvisorFiles;
use crate::backend::microvm::MicrovmFiles;
use crate::config::RuntimeConfig;
use crate::error::RuntimeError;
use crate::id_ranges::IdRange;
use crate::records::{RecordStore, SandboxRecord};

/// Owns a sandbox's host resources from the moment its record is written: whatever path the run takes (error,
/// panic, early return), dropping the guard kills what runs, removes the cgroup and then the record.
pub(crate) struct SandboxGuard {
    store: RecordStore,
    pub(crate) id: String,
    /// The sandbox's isolation tier (whose backend pauses and resumes it).
    pub(crate) tier: Tier,
    pub(crate) cgroup: Option<Cgroup>,
    /// The limits its cgroup was created with (to create it again: a gVisor sandbox restored from a checkpoint).
    pub(crate) cgroup_limits: Option<CgroupLimits>,
    /// What its earlier cgroups used (a gVisor sandbox's cgroup is removed at each checkpoint).
    pub(crate) earlier_usage: Usage,
    pub(crate) init_pid: Option<u32>,
    /// The gVisor sandbox's bundle and runsc state (gvisor tier only), removed after its processes.
    pub(crate) gvisor: Option<GvisorFiles>,
    /// The microVM sandbox's directory (disk, console, VMM log; microvm tier only), removed after its VMM.
    pub(crate) microvm: Option<MicrovmFiles>,
    /// How the microVM's guest started, once it booted (microvm tier only).
    pub(crate) vm_boot: Option<crate::VmBoot>,
    /// The sandbox's host id range (process tier only), released after everything else.
    pub(crate) id_range: Option<IdRange>,
    /// The host end of a microVM's egress door channel, from its spawn until the spawner hands it to the runtime.
    pub(crate) door: Option<std::os::fd::OwnedFd>,
}

impl SandboxGuard {
    /// Why the sandbox ended on its own, where its tier can tell (a microVM's guest kernel panic); read before
    /// `release` removes what says it.
    pub(crate) fn why_it_ended(&self) -> Option<String> {
        crate::backend::microvm::panic_line(&self.microvm.as_ref()?.console())
    }

    /// Writes the record of sandbox `id` (naming `id_range`, which the guard then holds, and the template `layers`
    /// its root reads).
    pub(crate) fn record(
        config: &RuntimeConfig,
        id: &str,
        tier: Tier,
        id_range: Option<IdRange>,
        layers: &[std::path::PathBuf],
    ) -> Result<SandboxGuard, RuntimeError> {
        let store = RecordStore::new(config.records_dir());
        let mut record = SandboxRecord::owned_by_me(id, tier.name(), &config.cgroup_parent);
        record.id_base = id_range.as_ref().map(IdRange::base);
        record.layers = layers.to_vec();
        store.write(&record)?;
        Ok(SandboxGuard {
            store,
            id: id.to_owned(),
            tier,
            cgroup: None,
            cgroup_limits: None,
            earlier_usage: Usage::default(),
            init_pid: None,
            gvisor: None,
            microvm: None,
            vm_boot: None,
            id_range,
            door: None,
        })
    }

    pub(crate) fn cgroup(&self) -> Result<&Cgroup, RuntimeError> {
        self.cgroup.as_ref().ok_or_else(|| RuntimeError::InvalidInput("the sandbox's cgroup is gone".into()))
    }

    /// What the sandbox used over its life: its cgroup's counters now plus its earlier cgroups' (CPU times add up,
    /// the memory peak is the highest).
    pub(crate) fn usage(&self) -> Usage {
        let now = self.cgroup.as_ref().and_then(|cgroup| cgroup.usage().ok()).unwrap_or_default();
        let earlier = &self.earlier_usage;
        Usage {
            cpu_user_ns: now.cpu_user_ns.saturating_add(earlier.cpu_user_ns),
            cpu_system_ns: now.cpu_system_ns.saturating_add(earlier.cpu_system_ns),
            memory_peak_bytes: now.memory_peak_bytes.max(earlier.memory_peak_bytes),
            oom_kills: now.oom_kills.saturating_add(earlier.oom_kills),
            pids_limit_hits: now.pids_limit_hits.saturating_add(earlier.pids_limit_hits),
        }
    }

    pub(crate) fn kill(&self) {
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

    pub(crate) fn reap(&mut self) {
        if let Some(pid) = self.init_pid.take() {
            let mut status = 0;
            // SAFETY: waitpid on our own child, writing into an owned integer.
            while unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) } < 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
            {}
        }
    }

    /// Removes the cgroup, then the record. When the cgroup cannot be removed, the record stays, so that `gc` (which
    /// starts from records) finds the cgroup again later.
    pub(crate) fn release(&mut self) -> Result<(), RuntimeError> {
        if let Some(files) = &self.gvisor {
            files.remove(&self.id).map_err(|e| {
                RuntimeError::sys_owned(format!("removing the gVisor bundle {}", files.bundle.display()), e)
            })?;
            self.gvisor = None;
        }
        if let Some(files) = &self.microvm {
            files.remove().map_err(|e| {
                RuntimeError::sys_owned(format!("removing the microVM's files {}", files.dir.display()), e)
            })?;
            self.microvm = None;
        }
        if let Some(cgroup) = &self.cgroup {
            cgroup.clone().remove()?;
            self.cgroup = None;
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
            // What is left may still run under the range: no other sandbox gets it while this process lives.
            if let Some(range) = &mut self.id_range {
                range.keep();
            }
        }
    }
}
