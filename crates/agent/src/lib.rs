//! The agent: PID 1 inside every sandbox, its own executable (`sandkasten agent`) whose plan arrives as the first
//! protocol message. On the process tier it finishes building the sandbox from inside (root filesystem, pivot); on
//! gVisor it serves the root it was given. It starts the program through the jail (one-shot) or serves commands and
//! file operations for a long-lived sandbox (`serve`), reaps every process, reports over the protocol, and by exiting
//! takes the whole sandbox down with it.

mod door;
mod guest;
mod init;
mod microvm;
mod reaper;
pub mod serve;
mod step;

pub use guest::run_agent;
pub use microvm::TEMPLATE_SERIAL;
