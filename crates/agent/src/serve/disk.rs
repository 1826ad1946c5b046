//! The `DiskUsage` request: how full the sandbox's writable filesystems are (its home, `/tmp`, `/dev/shm`), read
//! with `fstatfs` on each, every filesystem counted once (two paths on one filesystem are one).

use rustix::fs::{Mode, OFlags};
use sandkasten_protocol::Message;
use sandkasten_types::{DiskUsage, Failure, FailureKind};

use super::errors::sys_failure;
use super::paths::SandboxRoot;

/// The writable directories besides the home.
const SHARED_WRITABLE: [&str; 2] = ["/tmp", "/dev/shm"];

/// Answers `DiskUsage`: the fill of the filesystems under `home`, `/tmp` and `/dev/shm` added up (a missing one is
/// skipped).
pub fn usage(root: &SandboxRoot, home: &str) -> Result<Message, Failure> {
    let mut devices = Vec::new();
    let mut usage = DiskUsage::default();
    for path in std::iter::once(home).chain(SHARED_WRITABLE) {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = match root.as_sandbox_user(|| root.open_in_root(path, flags, Mode::empty())) {
            Ok(fd) => fd,
            Err(failure) if failure.kind == FailureKind::NotFound => continue,
            Err(failure) => return Err(failure),
        };
        let device = rustix::fs::fstat(&fd).map_err(|e| sys_failure("stat", path, e))?.st_dev;
        if devices.contains(&device) {
            continue;
        }
        devices.push(device);
        let fs = rustix::fs::fstatfs(&fd).map_err(|e| sys_failure("statfs", path, e))?;
        let block = u64::try_from(fs.f_bsize).unwrap_or(0);
        let blocks = fs.f_blocks;
        let free = fs.f_bfree.min(blocks);
        usage.total_bytes = usage.total_bytes.saturating_add(blocks.saturating_mul(block));
        usage.used_bytes = usage.used_bytes.saturating_add((blocks - free).saturating_mul(block));
    }
    Ok(Message::DiskUsageReply { usage })
}
