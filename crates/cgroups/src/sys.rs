//! The two raw syscalls this crate needs (`kill`, `access`); the only file allowed to use `unsafe`.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Sends SIGKILL to one process. Refuses pid 0 and pids that do not fit a positive `pid_t`,
/// so a bad value can never turn into "kill my process group" or "kill everything".
pub(crate) fn sigkill(pid: u32) -> io::Result<()> {
    let target = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    if target <= 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: kill(2) takes two integers and touches no memory of ours; `target` is a single positive pid.
    let rc = unsafe { libc::kill(target, libc::SIGKILL) };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Whether this process may create entries in `path` (access(2) with W_OK; false on any error,
/// including a read-only mount).
pub(crate) fn is_writable(path: &Path) -> bool {
    let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c_path` is a valid NUL-terminated string that outlives the call; access(2) only reads it.
    unsafe { libc::access(c_path.as_ptr(), libc::W_OK) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigkill_refuses_pid_zero_and_negative_pids() {
        assert!(sigkill(0).is_err());
        assert!(sigkill(u32::MAX).is_err());
    }

    #[test]
    fn tempdir_is_writable() {
        let dir = std::env::temp_dir();
        assert!(is_writable(&dir));
        assert!(!is_writable(Path::new("/nonexistent-sandkasten-path")));
    }
}
