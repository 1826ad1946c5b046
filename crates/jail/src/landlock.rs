//! Landlock filesystem restrictions for sandboxed programs: read and execute everywhere, write only beneath the
//! writable directories and to the writable device files, and (landlock ABI 6+) abstract unix sockets and signals
//! scoped to the sandbox. Applied best effort, so older kernels degrade instead of failing; the report says what
//! the kernel actually enforced.

use std::io;
use std::path::{Path, PathBuf};

use ::landlock::{
    ABI, Access, AccessFs, BitFlags, CompatLevel, Compatible, LandlockStatus, PathBeneath, PathFd, PathFdError,
    RestrictionStatus, Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetError, RulesetStatus, Scope,
};

/// The landlock ABI this policy is written and tested for. Newer ABIs add access rights (e.g. ABI 9 mediates
/// connecting to pathname unix sockets) that this policy would otherwise deny without granting them anywhere.
const POLICY_ABI: ABI = ABI::V6;

/// What the kernel enforced after [`restrict`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LandlockReport {
    /// Highest landlock ABI both the kernel and this policy enforce; 0 when nothing is enforced.
    pub abi: i32,
    /// "fully enforced", "partially enforced" or "not enforced".
    pub status: String,
}

/// A failed landlock step.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    /// Creating the ruleset (declaring the handled rights and scopes) failed.
    #[error("create landlock ruleset")]
    Ruleset(#[source] RulesetError),
    /// Opening a path for a rule or adding the rule failed (paths that do not exist are skipped, not errors).
    #[error("add landlock rule for {path}")]
    AddRule {
        /// The path the rule was for.
        path: PathBuf,
        /// What failed.
        #[source]
        source: AddRuleFailure,
    },
    /// `landlock_restrict_self` (or the `PR_SET_NO_NEW_PRIVS` before it) failed.
    #[error("landlock restrict_self")]
    RestrictSelf(#[source] RulesetError),
}

/// Why a single rule could not be added.
#[derive(Debug, thiserror::Error)]
pub enum AddRuleFailure {
    /// The path could not be opened with `O_PATH`.
    #[error("open path")]
    Open(#[source] PathFdError),
    /// `landlock_add_rule` refused the rule.
    #[error("landlock_add_rule")]
    Add(#[source] RulesetError),
}

/// Restricts the calling thread and its future children: read and execute everywhere (`/`), full write access
/// beneath each of `writable_dirs`, write (plus truncate and device ioctls where the ABI has them) on each of
/// `writable_files`. On landlock ABI 6+ abstract unix sockets and signals are also scoped to the sandbox.
///
/// Best effort: on kernels without (parts of) landlock the missing parts are skipped and the report says so.
/// Paths that do not exist are skipped. Call it in the forked child right before `execve`; it allocates, so the
/// forking process must be single-threaded.
pub fn restrict(writable_dirs: &[&Path], writable_files: &[&Path]) -> Result<LandlockReport, LandlockError> {
    let all = AccessFs::from_all(POLICY_ABI);
    let read_execute = AccessFs::from_read(POLICY_ABI);
    let file_write = (AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev) & all;

    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .and_then(|ruleset| ruleset.scope(Scope::from_all(POLICY_ABI)))
        .and_then(Ruleset::create)
        .map_err(LandlockError::Ruleset)?;

    ruleset = add_rule(ruleset, Path::new("/"), read_execute)?;
    for dir in writable_dirs {
        ruleset = add_rule(ruleset, dir, all)?;
    }
    for file in writable_files {
        ruleset = add_rule(ruleset, file, file_write)?;
    }

    let status = ruleset.restrict_self().map_err(LandlockError::RestrictSelf)?;
    Ok(report(&status))
}

/// Adds `access` beneath `path`; a missing path is skipped. Rights that only make sense on directories are dropped
/// when `path` is a file.
fn add_rule(ruleset: RulesetCreated, path: &Path, access: BitFlags<AccessFs>) -> Result<RulesetCreated, LandlockError> {
    let fd = match PathFd::new(path) {
        Ok(fd) => fd,
        Err(PathFdError::OpenCall { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            return Ok(ruleset);
        }
        Err(err) => {
            return Err(LandlockError::AddRule { path: path.to_path_buf(), source: AddRuleFailure::Open(err) });
        }
    };
    let access = if path.is_dir() { access } else { access & AccessFs::from_file(POLICY_ABI) };
    ruleset
        .add_rule(PathBeneath::new(fd, access))
        .map_err(|source| LandlockError::AddRule { path: path.to_path_buf(), source: AddRuleFailure::Add(source) })
}

fn report(status: &RestrictionStatus) -> LandlockReport {
    let (text, enforced) = match status.ruleset {
        RulesetStatus::FullyEnforced => ("fully enforced", true),
        RulesetStatus::PartiallyEnforced => ("partially enforced", true),
        RulesetStatus::NotEnforced => ("not enforced", false),
    };
    let abi = match status.landlock {
        LandlockStatus::Available { effective_abi, .. } if enforced => (effective_abi as i32).min(POLICY_ABI as i32),
        _ => 0,
    };
    LandlockReport { abi, status: text.to_owned() }
}

/// The landlock ABI the running kernel supports (may be newer than what [`restrict`] uses); 0 if landlock is not
/// built in or not enabled.
pub fn kernel_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag the kernel reads no memory and only
    // returns the ABI version (or -1 with errno ENOSYS/EOPNOTSUPP).
    #[allow(unsafe_code)]
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(version).unwrap_or(0).max(0)
}

#[cfg(test)]
#[allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;

    const OK: i32 = 0;
    const RESTRICT_FAILED: i32 = 100;
    const WRITE_INSIDE_FAILED: i32 = 101;
    const CREATE_OUTSIDE_SUCCEEDED: i32 = 102;
    const READ_HOSTNAME_FAILED: i32 = 103;
    const NOT_FULLY_ENFORCED: i32 = 104;

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("sandkasten-landlock-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn c_path(path: &Path) -> CString {
        CString::new(path.as_os_str().as_bytes()).unwrap()
    }

    /// Opens `path` with `flags` and returns 0 or the errno.
    fn open_errno(path: &CString, flags: libc::c_int) -> i32 {
        // SAFETY: `path` is a valid nul-terminated string; the fd is closed right away.
        let fd = unsafe { libc::open(path.as_ptr(), flags, 0o600) };
        if fd < 0 {
            return io::Error::last_os_error().raw_os_error().unwrap_or(-1);
        }
        // SAFETY: `fd` was just opened by us.
        unsafe { libc::close(fd) };
        0
    }

    fn wait_exit_code(pid: libc::pid_t) -> i32 {
        let mut status = 0;
        // SAFETY: waiting for our own child with a valid status pointer.
        let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(waited, pid, "waitpid failed");
        assert!(libc::WIFEXITED(status), "child did not exit normally: status {status:#x}");
        libc::WEXITSTATUS(status)
    }

    #[test]
    fn kernel_supports_landlock() {
        assert!(kernel_abi() >= 1, "landlock abi {}", kernel_abi());
    }

    #[test]
    fn writes_outside_writable_dirs_are_denied() {
        let writable = temp_dir("writable");
        let other = temp_dir("other");
        let inside = c_path(&writable.join("inside.txt"));
        let outside = c_path(&other.join("outside.txt"));
        let hostname = c_path(Path::new("/etc/hostname"));
        let writable_files = [Path::new("/dev/null")];

        // SAFETY: the child runs restrict() (which allocates; acceptable in a test child) and raw syscalls, then
        // leaves with _exit without running the parent's destructors or test harness code.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = match restrict(&[writable.as_path()], &writable_files) {
                Err(_) => RESTRICT_FAILED,
                Ok(report) if report.status != "fully enforced" || report.abi != 6 => NOT_FULLY_ENFORCED,
                Ok(_) => {
                    if open_errno(&inside, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC) != 0 {
                        WRITE_INSIDE_FAILED
                    } else if open_errno(&outside, libc::O_CREAT | libc::O_WRONLY) != libc::EACCES {
                        CREATE_OUTSIDE_SUCCEEDED
                    } else if open_errno(&hostname, libc::O_RDONLY) != 0 {
                        READ_HOSTNAME_FAILED
                    } else {
                        OK
                    }
                }
            };
            // SAFETY: terminating the forked child without unwinding into the test harness.
            unsafe { libc::_exit(code) };
        }
        let code = wait_exit_code(pid);
        let outside_exists = other.join("outside.txt").exists();
        std::fs::remove_dir_all(&writable).ok();
        std::fs::remove_dir_all(&other).ok();
        assert_eq!(code, OK, "child reported failure code {code}");
        assert!(!outside_exists, "file outside the writable dir was created");
    }

    #[test]
    fn writable_files_allow_writing_but_not_creating_siblings() {
        let dir = temp_dir("files");
        let file = dir.join("allowed");
        std::fs::write(&file, b"x").unwrap();
        let allowed = c_path(&file);
        let sibling = c_path(&dir.join("sibling"));

        // SAFETY: as in writes_outside_writable_dirs_are_denied.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = match restrict(&[], &[file.as_path(), Path::new("/does/not/exist")]) {
                Err(_) => RESTRICT_FAILED,
                Ok(_) => {
                    if open_errno(&allowed, libc::O_WRONLY | libc::O_TRUNC) != 0 {
                        WRITE_INSIDE_FAILED
                    } else if open_errno(&sibling, libc::O_CREAT | libc::O_WRONLY) != libc::EACCES {
                        CREATE_OUTSIDE_SUCCEEDED
                    } else {
                        OK
                    }
                }
            };
            // SAFETY: terminating the forked child without unwinding into the test harness.
            unsafe { libc::_exit(code) };
        }
        let code = wait_exit_code(pid);
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(code, OK, "child reported failure code {code}");
    }
}
