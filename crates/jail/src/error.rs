//! One error variant per failing kernel call, so a log line says exactly which containment step failed.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

pub use crate::landlock::LandlockError;
pub use crate::seccomp::SeccompError;

/// A containment step that failed.
#[derive(Debug, Error)]
pub enum JailError {
    /// clone(2) with the namespace flags failed.
    #[error("clone with new namespaces failed: {0}")]
    Clone(#[source] io::Error),
    /// Writing `/proc/<pid>/uid_map`, `gid_map` or `setgroups` failed.
    #[error("writing {path} failed: {source}")]
    IdMap {
        /// The map file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// setgroups/setresgid/setresuid failed.
    #[error("switching to ids {uid}:{gid} failed: {source}")]
    SetIds {
        /// The user id asked for (inside the sandbox).
        uid: u32,
        /// The group id asked for.
        gid: u32,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// unshare(2) of a namespace after setup failed.
    #[error("unshare failed: {0}")]
    Unshare(#[source] io::Error),
    /// Making, passing or attaching a build sandbox's idmapped layer mounts (`idmap`) failed.
    #[error("{what} failed: {source}")]
    Idmap {
        /// The step that failed.
        what: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// sethostname(2) failed.
    #[error("sethostname failed: {0}")]
    SetHostname(#[source] io::Error),
    /// Bringing the loopback interface up failed.
    #[error("bringing up lo failed: {0}")]
    Loopback(#[source] io::Error),
    /// mount(2) failed.
    #[error("mounting {what} on {target} failed: {source}")]
    Mount {
        /// What was mounted (a filesystem type or a source path).
        what: String,
        /// Where.
        target: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Reading a host file to copy it into the new root, or the mount table, failed.
    #[error("reading the host's {path} failed: {source}")]
    ReadHost {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Creating a directory, file or symlink of the new root failed.
    #[error("creating {path} in the new root failed: {source}")]
    CreatePath {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// pivot_root(2) failed.
    #[error("pivot_root failed: {0}")]
    PivotRoot(#[source] io::Error),
    /// Detaching the old root failed.
    #[error("unmounting the old root failed: {0}")]
    UnmountOldRoot(#[source] io::Error),
    /// chdir(2) failed.
    #[error("chdir to {path} failed: {source}")]
    Chdir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// setrlimit(2) failed.
    #[error("setting rlimit {name} failed: {source}")]
    Rlimit {
        /// The resource.
        name: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Dropping capabilities failed.
    #[error("dropping capabilities failed: {0}")]
    Capabilities(String),
    /// prctl(2) failed.
    #[error("prctl {option} failed: {source}")]
    Prctl {
        /// The option name.
        option: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// setsid(2) failed.
    #[error("setsid failed: {0}")]
    Setsid(#[source] io::Error),
    /// ioctl(TIOCSCTTY) on the program's terminal failed.
    #[error("making the pseudo-terminal the controlling terminal (TIOCSCTTY) failed: {0}")]
    ControllingTerminal(#[source] io::Error),
    /// Closing inherited file descriptors failed.
    #[error("closing inherited file descriptors failed: {0}")]
    CloseFds(#[source] io::Error),
    /// dup2(2) of a standard stream failed.
    #[error("connecting standard stream {fd} failed: {source}")]
    Dup2 {
        /// The target descriptor.
        fd: i32,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The program to run was not found on the sandbox's PATH.
    #[error("{0}: command not found in the sandbox (PATH={path})", path = crate::environment::SANDBOX_PATH)]
    ProgramNotFound(String),
    /// execve(2) failed.
    #[error("executing {program} failed: {source}")]
    Exec {
        /// The program.
        program: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// An argument, environment entry or path contained a NUL byte.
    #[error("{0} contains a NUL byte")]
    NulByte(String),
    /// Installing the seccomp filter failed.
    #[error(transparent)]
    Seccomp(#[from] SeccompError),
    /// Applying landlock failed.
    #[error(transparent)]
    Landlock(#[from] LandlockError),
}

/// The last OS error as an `io::Error`.
pub(crate) fn last_os_error() -> io::Error {
    io::Error::last_os_error()
}
