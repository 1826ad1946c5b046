//! The life of a sandbox, in one place, for every caller: the API's handlers, the E2B facade, `POST /v1/run`'s task,
//! `serve_on` and the background tasks.
//!
//! - `start`: tier, egress, pool claim, quota admission, creation, egress door; nothing remains of a failed start;
//! - `destroy`: the runtime's sandbox with its egress door and E2B session; deleted, run finished, or lost;
//! - [`expiry`]: a timeout's expiry time, and the sweeper that ends (or, with `auto_pause`, pauses) expired sandboxes;
//! - `fork`: copies of a running sandbox (`copy`: its files into others, at once);
//! - `snapshot`: filesystem snapshots taken, restored into new sandboxes, deleted, reconciled with the store at start;
//! - `pause`: pausing and resuming (database and runtime together, a resume admitted like a create), with memory
//!   or to the filesystem (`pause_files`: the files saved, the sandbox released, made again by the resume);
//! - [`reconcile`]: at start, tenants recorded and sandboxes (and commands) the runtime no longer has marked lost;
//! - [`refill`]: the warm pools' refill task, resizes that destroy surplus members, idle members at shutdown.
//!
//! Dependencies point one way: `api` and `e2b` call this module; it uses the store, the runtime, egress and the pools'
//! bookkeeping, and never an HTTP handler (`tests/api/layering.rs` checks it). Failures are [`LifecycleError`]s,
//! which the API and the facade answer in their own wire shapes.

pub mod auto_isolation;
mod copy;
mod destroy;
mod detached;
mod error;
pub mod expiry;
mod fork;
mod memory_snapshot;
mod pause;
mod pause_files;
mod pause_snapshot;
pub mod reconcile;
pub mod refill;
mod snapshot;
mod snapshot_errors;
mod start;

pub(crate) use destroy::{end_running, finish_run, note_lost};
pub use error::LifecycleError;
pub(crate) use expiry::check_timeout;
pub(crate) use fork::fork;
pub(crate) use memory_snapshot::start_from_memory;
pub(crate) use pause::{ensure_resumed, pause, resume};
pub(crate) use snapshot::{delete_snapshot, reconcile_snapshots, start_on_files, take_snapshot, usable_snapshot};
pub(crate) use start::{SIGKILL, abandon, pids_cap, resolve_isolation, start_sandbox, start_sandbox_with_zygote};
