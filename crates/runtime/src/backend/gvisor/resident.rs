//! Keeps runsc's code in memory, charged to this process, before any sandbox runs it. A page of the runsc binary is
//! charged to the memory cgroup of whoever first reads it into the page cache: on a cold cache that is the first
//! sandbox whose Sentry runs it. Under a memory bomb that sandbox's cgroup then evicts the Sentry's own code, the
//! Sentry faults it back in to free the killed program's memory, each fault needs a page the cgroup has not got, and
//! the OOM killer takes one stub after another until the agent's goes and the sandbox is lost (seen in the kernel log
//! as `filemap_fault` OOMs and a climbing `workingset_refault_file`). So the process that starts runsc first maps
//! the binary and locks it (`mlock`): every page is read by and charged to us, never evicted, and a Sentry's faults
//! on it find it resident (shared, charged to no sandbox). One mapping per binary (device and inode: an upgrade of
//! runsc maps the new file and drops the old), held for the life of the process; about 30 MiB of the host's memory,
//! the same pages every Sentry maps anyway. Where `mlock` is refused (no `CAP_IPC_LOCK`, a small `RLIMIT_MEMLOCK`)
//! the pages are read once instead: charged to us, evictable only by the host's own memory pressure.

#![allow(unsafe_code)]

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Mutex;

/// The binary pinned by this process, if any.
static PINNED: Mutex<Option<Pinned>> = Mutex::new(None);

/// Maps and locks `runsc` unless this process holds it already. Best effort: a failure is logged and the sandbox
/// starts as before.
pub(super) fn pin(runsc: &Path) {
    let Ok(mut pinned) = PINNED.lock() else { return };
    match Pinned::refresh(pinned.take(), runsc) {
        Ok(now) => *pinned = Some(now),
        Err(error) => tracing::warn!(runsc = %runsc.display(), %error, "keeping runsc's code in memory"),
    }
}

/// A read-only mapping of a whole file, locked in memory where allowed; unmapped on drop.
#[derive(Debug)]
struct Pinned {
    dev: u64,
    ino: u64,
    /// The mapping's address (a `usize`, so that the static is `Send`).
    addr: usize,
    len: usize,
    locked: bool,
}

impl Pinned {
    /// `current` if it maps `path`'s file, else a new mapping of it (`current` is dropped, which unmaps it).
    fn refresh(current: Option<Pinned>, path: &Path) -> std::io::Result<Pinned> {
        let file = File::open(path)?;
        let meta = file.metadata()?;
        if let Some(current) = current.filter(|held| (held.dev, held.ino) == (meta.dev(), meta.ino())) {
            return Ok(current);
        }
        let len = usize::try_from(meta.len()).map_err(|_| std::io::Error::from(std::io::ErrorKind::FileTooLarge))?;
        if len == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "the file is empty"));
        }
        // SAFETY: a new private read-only mapping of a file we opened, at an address the kernel picks; nothing else
        // refers to it, and it is unmapped only by `Drop`.
        let addr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ,
                rustix::mm::MapFlags::PRIVATE,
                &file,
                0,
            )
        }?;
        let mut pinned = Pinned { dev: meta.dev(), ino: meta.ino(), addr: addr as usize, len, locked: false };
        // SAFETY: locks the range mapped just above, which stays mapped until `Drop`.
        match unsafe { rustix::mm::mlock(addr, len) } {
            Ok(()) => pinned.locked = true,
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "runsc's code cannot be locked in memory: reading it once");
                pinned.touch();
            }
        }
        Ok(pinned)
    }

    /// Reads one byte of every page, so that each is in the page cache (charged to this process where it was not).
    fn touch(&self) {
        let page = rustix::param::page_size();
        let mut sum = 0u8;
        for offset in (0..self.len).step_by(page) {
            // SAFETY: `offset < len`, inside the readable mapping this value owns.
            sum = sum.wrapping_add(unsafe { std::ptr::read_volatile((self.addr + offset) as *const u8) });
        }
        std::hint::black_box(sum);
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `refresh` with this address and length and nothing else refers to it.
        if let Err(error) = unsafe { rustix::mm::munmap(self.addr as *mut std::ffi::c_void, self.len) } {
            tracing::warn!(%error, "unmapping runsc's code");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The `Locked:` kilobytes of the mapping of this process at `addr` (from `/proc/self/smaps`).
    fn locked_kib(addr: usize) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let start = format!("{addr:x}-");
        let mut lines = smaps.lines().skip_while(|line| !line.starts_with(&start));
        lines.next()?;
        lines
            .find_map(|line| line.strip_prefix("Locked:"))
            .map(|kib| kib.trim().trim_end_matches(" kB").parse().unwrap())
    }

    /// Whether this process has a mapping starting at `addr`.
    fn mapped(addr: usize) -> bool {
        let start = format!("{addr:x}-");
        std::fs::read_to_string("/proc/self/maps").unwrap().lines().any(|line| line.starts_with(&start))
    }

    #[test]
    fn a_file_is_mapped_whole_and_locked_once_and_a_replaced_file_replaces_the_mapping() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runsc");
        std::fs::write(&path, vec![7u8; 64 << 10]).unwrap();
        let first = Pinned::refresh(None, &path).unwrap();
        assert_eq!(first.len, 64 << 10);
        assert!(mapped(first.addr));
        if first.locked {
            assert_eq!(locked_kib(first.addr), Some(64), "the whole file is locked");
        }
        let addr = first.addr;
        let again = Pinned::refresh(Some(first), &path).unwrap();
        assert_eq!(again.addr, addr, "the same file is not mapped twice");

        // An upgrade replaces the file (a new inode): the new one is mapped, the old mapping goes.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, vec![9u8; 8 << 10]).unwrap();
        let upgraded = Pinned::refresh(Some(again), &path).unwrap();
        assert_eq!(upgraded.len, 8 << 10);
        assert!(mapped(upgraded.addr));
        let old = format!("{} (deleted)", path.display());
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        assert!(!maps.lines().any(|line| line.ends_with(&old)), "the old file stays mapped: {maps}");
    }

    #[test]
    fn a_missing_or_empty_file_is_an_error_and_keeps_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Pinned::refresh(None, &dir.path().join("missing")).is_err());
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        assert!(Pinned::refresh(None, &empty).is_err());
    }
}
