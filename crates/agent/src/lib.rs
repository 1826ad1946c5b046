//! The guest agent: PID 1 inside every sandbox. It finishes building the sandbox from inside (namespace root, root
//! filesystem, pivot), starts the program through the jail (one-shot) or serves commands and file operations for a
//! long-lived sandbox (`serve`), reaps every process, reports over the protocol, and by exiting takes the whole pid
//! namespace down with it.

mod door;
mod guest;
mod init;
mod reaper;
mod scrub;
pub mod serve;
mod step;

pub use guest::run_guest;
pub use init::{AgentMode, InitPlan, run_init};
