//! The guest agent: PID 1 inside every sandbox. It finishes building the sandbox from inside (namespace root, root
//! filesystem, pivot), starts the program through the jail, reaps every process, reports over the protocol, and by
//! exiting takes the whole pid namespace down with it.

mod init;
mod reaper;
mod scrub;
mod step;

pub use init::{InitPlan, run_init};
