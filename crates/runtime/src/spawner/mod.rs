//! The spawner: a single-threaded helper process that creates and destroys long-lived sandboxes for a
//! multi-threaded owner (the server). Forking from a tokio worker is never safe (another thread may hold the
//! allocator's lock at that instant), so the server starts `sandkasten spawner` once, talks to it over a
//! `SOCK_SEQPACKET` socketpair (one JSON message per packet), and receives each new agent's protocol channel as a
//! file descriptor (SCM_RIGHTS). From then on the server talks to the agent directly.
//!
//! The spawner is the parent of every agent: it reaps them, removes their cgroups and records, and reports exits.
//! When its control socket closes (the server exited or crashed), it destroys every sandbox and exits; when the
//! spawner itself dies, each agent's parent-death signal kills it and `gc` removes the rest.

mod client;
mod messages;
mod service;
mod transport;

pub use client::{SpawnedSandbox, SpawnerClient, SpawnerEvent};
pub use messages::{SpawnerRequest, SpawnerResponse};
pub use service::run_spawner;
