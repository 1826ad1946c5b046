//! Resource limits (setrlimit) of the sandboxed program; the cgroup carries the limits that span processes.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

use crate::error::JailError;

/// Per-process limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessRlimits {
    /// Largest file a process may write (RLIMIT_FSIZE), in bytes: the disk limit. Beyond it: SIGXFSZ.
    pub file_size_bytes: u64,
    /// Open file descriptors (RLIMIT_NOFILE).
    pub open_files: u64,
    /// Stack size (RLIMIT_STACK), in bytes.
    pub stack_bytes: u64,
    /// Processes of the sandbox user (RLIMIT_NPROC), where that count is the sandbox's own (gVisor, whose users are
    /// the Sentry's): `None` on the process tier, whose sandboxes share one host uid (the pids cgroup limits them).
    pub processes: Option<u64>,
}

impl ProcessRlimits {
    /// Defaults for a given disk limit: 1024 open files, 8 MiB stack.
    pub fn for_disk(disk_bytes: u64) -> Self {
        ProcessRlimits { file_size_bytes: disk_bytes, open_files: 1024, stack_bytes: 8 << 20, processes: None }
    }
}

/// Applies the limits; core dumps are always disabled (RLIMIT_CORE 0).
pub fn apply(limits: &ProcessRlimits) -> Result<(), JailError> {
    let set = |name, resource, value: u64| {
        setrlimit(resource, Rlimit { current: Some(value), maximum: Some(value) })
            .map_err(|e| JailError::Rlimit { name, source: e.into() })
    };
    set("RLIMIT_CORE", Resource::Core, 0)?;
    set("RLIMIT_FSIZE", Resource::Fsize, limits.file_size_bytes)?;
    set("RLIMIT_NOFILE", Resource::Nofile, limits.open_files)?;
    set("RLIMIT_STACK", Resource::Stack, limits.stack_bytes)?;
    if let Some(processes) = limits.processes {
        set("RLIMIT_NPROC", Resource::Nproc, processes)?;
    }
    // Per-user kernel objects: small, so one sandbox cannot use up what every sandbox of its owner shares. Never
    // above the inherited hard limit (raising it would need CAP_SYS_RESOURCE in the host).
    let lower = |resource, value: u64| getrlimit(resource).maximum.map_or(value, |hard| hard.min(value));
    // Lowering never fails on Linux; gVisor refuses to change these two with EPERM (its Sentry keeps such quotas
    // per sandbox itself), which is then no loss.
    let lower_if_supported = |name, resource, value: u64| match set(name, resource, lower(resource, value)) {
        Err(JailError::Rlimit { source, .. }) if source.raw_os_error() == Some(libc::EPERM) => Ok(()),
        other => other,
    };
    lower_if_supported("RLIMIT_SIGPENDING", Resource::Sigpending, 1024)?;
    lower_if_supported("RLIMIT_MSGQUEUE", Resource::Msgqueue, 256 << 10)?;
    Ok(())
}
