//! Per-sandbox cgroups on cgroup v1 and v2 hosts: detect the host hierarchy, create a cgroup with memory,
//! pids and CPU limits, put processes in it, kill everything inside, read usage, remove it.
//!
//! The version is chosen at run time (`Hierarchy::detect`). Directories are only ever removed with
//! `rmdir`. The only `unsafe` code is the two raw syscalls in `sys.rs`.
#![deny(unsafe_code)]

mod cgroup;
mod detect;
mod error;
mod fsops;
mod hierarchy;
mod kill;
mod limits;
mod mountinfo;
mod sys;
mod usage;
mod v1;
mod v2;

use std::fmt;

pub use cgroup::Cgroup;
pub use error::CgroupError;
pub use hierarchy::Hierarchy;
pub use limits::CgroupLimits;
pub use usage::{MemoryNow, Usage};

/// Which cgroup interface a hierarchy uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CgroupVersion {
    /// Legacy: one mount per controller (or group of co-mounted controllers).
    V1,
    /// Unified: one tree, controllers enabled per subtree.
    V2,
}

impl fmt::Display for CgroupVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        })
    }
}
