//! The one error type of this crate: every failing file operation or syscall is its own variant carrying the path.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

/// Why a cgroup operation failed. Each variant names the step and carries the path (or pid) it failed on.
#[derive(Debug, Error)]
pub enum CgroupError {
    /// The mount table could not be read.
    #[error("reading mount table {path}")]
    ReadMountinfo {
        /// Usually `/proc/self/mountinfo`.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The mount table lists no usable cgroup hierarchy.
    #[error("no usable cgroup hierarchy in {path}")]
    NoHierarchy {
        /// The mount table that was searched.
        path: PathBuf,
    },
    /// A cgroup name or parent path is empty, absolute, or contains `.`/`..` components.
    #[error("invalid cgroup name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A limit was requested for a controller this hierarchy does not have.
    #[error("controller {controller} is not available for {path}")]
    ControllerUnavailable {
        /// The missing controller (`memory`, `pids`, `cpu`).
        controller: &'static str,
        /// The cgroup (v2) or the parent path (v1) the limit was meant for.
        path: PathBuf,
    },
    /// None of the needed v1 controllers is mounted.
    #[error("none of the needed cgroup v1 controllers is mounted")]
    NoControllers,
    /// `mkdir` of a cgroup directory failed.
    #[error("creating cgroup directory {path}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// `rmdir` of a cgroup directory failed.
    #[error("removing cgroup directory {path}")]
    RemoveDir {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Listing a directory failed.
    #[error("listing directory {path}")]
    ReadDir {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Reading a control file failed.
    #[error("reading {path}")]
    Read {
        /// The control file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Writing a control file failed.
    #[error("writing {value:?} to {path}")]
    Write {
        /// The control file.
        path: PathBuf,
        /// What was written.
        value: String,
        /// The underlying error.
        source: io::Error,
    },
    /// A control file held something that is not in the expected format.
    #[error("unexpected content in {path}: {content:?}")]
    Parse {
        /// The control file.
        path: PathBuf,
        /// The offending text.
        content: String,
    },
    /// `kill(pid, SIGKILL)` failed with something other than "no such process".
    #[error("sending SIGKILL to pid {pid}")]
    Kill {
        /// The target process.
        pid: u32,
        /// The underlying error.
        source: io::Error,
    },
    /// A freeze or thaw did not take effect before the deadline.
    #[error("{path} did not reach the {wanted} state in time")]
    FreezeTimeout {
        /// The freezer file.
        path: PathBuf,
        /// `frozen` or `thawed`.
        wanted: &'static str,
    },
    /// Freezing was asked of a cgroup without a freezer (v1 without the freezer controller).
    #[error("the cgroup {name} has no freezer controller: mount the v1 freezer (or use cgroup v2) to pause sandboxes")]
    NoFreezer {
        /// The cgroup's name.
        name: String,
    },
    /// Processes were still in the cgroup when the kill deadline passed.
    #[error("processes {pids:?} still in {path} after kill")]
    KillTimeout {
        /// The cgroup directory.
        path: PathBuf,
        /// The pids still listed in `cgroup.procs`.
        pids: Vec<u32>,
    },
}
