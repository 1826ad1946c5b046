//! Keeps runsc's code in memory, charged to this process, before any sandbox runs it. A page of the runsc binary is
//! charged to the memory cgroup of whoever first reads it into the page cache: on a cold cache that is the first
//! sandbox whose Sentry runs it. Under a memory bomb that sandbox's cgroup then evicts the Sentry's own code, the
//! Sentry faults it back in to free the killed program's memory, each fault needs a page the cgroup has not got, and
//! the OOM killer takes one stub after another until the agent's goes and the sandbox is lost (seen in the kernel log
//! as `filemap_fault` OOMs and a climbing `workingset_refault_file`). So the process that starts runsc (the spawner,
//! or a one-shot CLI run) first maps the binary and locks it (`mlock`): every page is read by and charged to it,
//! never evicted, and a Sentry's faults on it find it resident (shared, charged to no sandbox). One mapping per
//! version of the binary (device, inode, size and modification time: an upgrade maps the new file and drops the
//! old), held for the life of the process; about 30 MiB of the host's memory, the same pages every Sentry maps
//! anyway. Where `mlock` is refused (no `CAP_IPC_LOCK`, a small `RLIMIT_MEMLOCK`) nothing is mapped and every start
//! reads the file ahead instead (`POSIX_FADV_WILLNEED`): what the host's own memory pressure evicted comes back
//! charged to this process, not to the sandbox about to start.

#![allow(unsafe_code)]

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

/// The binary pinned by this process, if any.
static PINNED: Mutex<Option<Pinned>> = Mutex::new(None);

/// Maps and locks `runsc` unless this process holds that version already. Best effort: a failure is logged, a pin
/// held stays, and the sandbox starts as before.
pub(super) fn pin(runsc: &Path) {
    let mut pinned = PINNED.lock().unwrap_or_else(PoisonError::into_inner);
    match Pinned::refresh(pinned.take(), runsc) {
        Ok(now) => *pinned = Some(now),
        Err((kept, error)) => {
            *pinned = kept;
            tracing::warn!(runsc = %runsc.display(), %error, "keeping runsc's code in memory");
        }
    }
}

/// Which version of a file: device, inode, size, modification time (an overwrite in place keeps the inode).
type Version = (u64, u64, u64, i64, i64);

fn version_of(meta: &std::fs::Metadata) -> Version {
    (meta.dev(), meta.ino(), meta.size(), meta.mtime(), meta.mtime_nsec())
}

/// A read-only mapping of a whole file, locked in memory (unmapped on drop); or, where locking was refused, only the
/// file's version (its pages read ahead on every `refresh`).
#[derive(Debug)]
struct Pinned {
    version: Version,
    /// The locked mapping's address and length (the address a `usize`, so that the static is `Send`).
    locked: Option<(usize, usize)>,
}

impl Pinned {
    /// `current` if it pins `path`'s file as it is now, else a new pin of it (`current` is dropped, which unmaps
    /// it). On error, `current` comes back with the error.
    fn refresh(current: Option<Pinned>, path: &Path) -> Result<Pinned, (Option<Pinned>, std::io::Error)> {
        let file = match File::open(path) {
            Ok(file) => file,
            Err(error) => return Err((current, error)),
        };
        let meta = match file.metadata() {
            Ok(meta) => meta,
            Err(error) => return Err((current, error)),
        };
        let version = version_of(&meta);
        match current {
            Some(held) if held.version == version && held.locked.is_some() => return Ok(held),
            Some(held) if held.version == version => {
                read_ahead(&file, path);
                return Ok(held);
            }
            // Another version: the old mapping goes.
            _ => {}
        }
        let len = match usize::try_from(meta.len()) {
            Ok(0) => return Err((None, std::io::Error::new(std::io::ErrorKind::InvalidData, "the file is empty"))),
            Ok(len) => len,
            Err(_) => return Err((None, std::io::Error::from(std::io::ErrorKind::FileTooLarge))),
        };
        // SAFETY: a new private read-only mapping of a file we opened, at an address the kernel picks; nothing else
        // refers to it, and it is unmapped below or by `Drop`.
        let addr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ,
                rustix::mm::MapFlags::PRIVATE,
                &file,
                0,
            )
        }
        .map_err(|error| (None, error.into()))?;
        // SAFETY: locks the range mapped just above, which stays mapped until `Drop`.
        match unsafe { rustix::mm::mlock(addr, len) } {
            Ok(()) => Ok(Pinned { version, locked: Some((addr as usize, len)) }),
            Err(error) => {
                // SAFETY: unmaps the mapping made above, which nothing refers to.
                let _ = unsafe { rustix::mm::munmap(addr, len) };
                tracing::warn!(path = %path.display(), %error, "runsc's code cannot be locked in memory: reading it ahead at each start");
                read_ahead(&file, path);
                Ok(Pinned { version, locked: None })
            }
        }
    }
}

/// Asks the kernel to read the whole of `file` into the page cache now (on this process's account).
fn read_ahead(file: &File, path: &Path) {
    if let Err(error) = rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::WillNeed) {
        tracing::debug!(path = %path.display(), %error, "reading runsc ahead");
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let Some((addr, len)) = self.locked else { return };
        // SAFETY: the mapping was made by `refresh` with this address and length and nothing else refers to it.
        if let Err(error) = unsafe { rustix::mm::munmap(addr as *mut std::ffi::c_void, len) } {
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

    /// The length of this process's mapping that starts at `addr`, if there is one.
    fn mapping_len(addr: usize) -> Option<usize> {
        let start = format!("{addr:x}-");
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = maps.lines().find(|line| line.starts_with(&start))?;
        let end = line.split([' ', '-']).nth(1)?;
        Some(usize::from_str_radix(end, 16).unwrap() - addr)
    }

    fn locked(pinned: &Pinned) -> (usize, usize) {
        pinned.locked.unwrap_or_else(|| panic!("not locked (no CAP_IPC_LOCK and a small RLIMIT_MEMLOCK?)"))
    }

    #[test]
    fn a_file_is_mapped_whole_and_locked_once_per_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runsc");
        std::fs::write(&path, vec![7u8; 64 << 10]).unwrap();
        let first = Pinned::refresh(None, &path).unwrap();
        let (addr, len) = locked(&first);
        assert_eq!((len, mapping_len(addr)), (64 << 10, Some(64 << 10)));
        assert_eq!(locked_kib(addr), Some(64), "the whole file is locked");
        let again = Pinned::refresh(Some(first), &path).unwrap();
        assert_eq!(locked(&again), (addr, len), "the same version is not mapped twice");

        // Overwritten in place (the same inode, another size): the new contents are mapped, the old mapping goes.
        std::fs::write(&path, vec![8u8; 32 << 10]).unwrap();
        let overwritten = Pinned::refresh(Some(again), &path).unwrap();
        let (addr, len) = locked(&overwritten);
        assert_eq!((len, mapping_len(addr)), (32 << 10, Some(32 << 10)));

        // Replaced (a new inode): the same.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, vec![9u8; 8 << 10]).unwrap();
        let replaced = Pinned::refresh(Some(overwritten), &path).unwrap();
        let (addr, len) = locked(&replaced);
        assert_eq!((len, mapping_len(addr)), (8 << 10, Some(8 << 10)));
        let old = format!("{} (deleted)", path.display());
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        assert!(!maps.lines().any(|line| line.ends_with(&old)), "the old file stays mapped: {maps}");

        // Gone for a moment (an upgrade's `rm; cp`): the pin held stays.
        std::fs::remove_file(&path).unwrap();
        let Err((kept, _)) = Pinned::refresh(Some(replaced), &path) else { panic!("a missing file was pinned") };
        assert_eq!(kept.as_ref().map(locked), Some((addr, len)));
        drop(kept);
        assert_eq!(mapping_len(addr), None, "dropping a pin unmaps it");
    }

    #[test]
    fn a_missing_or_empty_file_is_an_error_and_pins_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(Pinned::refresh(None, &dir.path().join("missing")), Err((None, _))));
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        assert!(matches!(Pinned::refresh(None, &empty), Err((None, _))));
    }
}
