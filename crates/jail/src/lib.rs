//! The only privileged setup code of sandkasten's process tier: namespaces, the root filesystem, capabilities,
//! rlimits, landlock and seccomp, one file per kernel mechanism, in the order nsjail applies them.
//!
//! The sequence, split across the host and the sandbox's init (PID 1 of the new pid namespace):
//! 1. host: `namespaces::clone_into_namespaces` (user, mnt, pid, net, ipc, uts in one clone);
//! 2. host: `namespaces::write_id_maps` (inside 0..65536 → an unprivileged host range), cgroup placement; a build
//!    sandbox's idmapped layer mounts (`idmap`), made before the clone, sent after the plan;
//! 3. init: `namespaces::become_namespace_root`, `enter_cgroup_namespace`, `set_hostname`, `net::bring_up_loopback`;
//! 4. init: `rootfs::plan_rootfs` + `mounts::execute`, then `mounts::pivot_into`;
//! 5. program: `process::contain_and_exec` (ids, capabilities, no_new_privs, landlock, fds, seccomp, execve).

pub mod capabilities;
pub mod environment;
mod error;
pub mod idmap;
pub mod landlock;
pub mod mounts;
pub mod namespaces;
pub mod net;
pub mod process;
pub mod rlimits;
pub mod rootfs;
pub mod seccomp;

pub use error::JailError;
