//! The process tier's agent: it builds the sandbox from inside (hostname, loopback, the root filesystem, pivot_root),
//! answers `FilesystemReady`, waits for the host to place it in the sandbox's cgroup, then serves requests (a one-shot
//! run is one request like any other). The starter has already made it the root of its user namespace
//! and armed the parent-death signal before executing it (`sandkasten agent`); its plan came as the first frame.

#![allow(unsafe_code)]

use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use sandkasten_jail::process::ProcessJail;
use sandkasten_jail::rootfs::{RealHostFs, RootfsSpec, plan_rootfs};
use sandkasten_jail::{mounts, namespaces, net};
use sandkasten_protocol::{AgentPlan, Envelope, Message, monotonic_ns, read_frame, write_frame};

/// Where the new root is assembled before pivot_root (a tmpfs is mounted over it).
const NEW_ROOT: &str = "/tmp";

fn send(channel: &mut UnixStream, msg: Message) {
    // A failed send means the host is gone; the agent then dies by its parent-death signal or ends on its own.
    let _ = write_frame(channel, &Envelope::new(0, msg));
}

pub(crate) fn unblock_all_signals() {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it and sigprocmask reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
}

/// Builds the sandbox and serves it.
pub(crate) fn run(plan: &AgentPlan, jail: &ProcessJail<'_>, channel: &mut UnixStream) -> Result<(), String> {
    if host_hung_up(channel) {
        return Err("the host exited before the sandbox was built".to_owned());
    }
    let rootfs = RootfsSpec {
        new_root: PathBuf::from(NEW_ROOT),
        home: PathBuf::from(&plan.home),
        disk_bytes: plan.disk_bytes,
        sandbox_uid: plan.uid,
        sandbox_gid: plan.gid,
        files: plan.root_files.clone(),
    };
    build_sandbox(&rootfs).map_err(|e| e.to_string())?;
    send(channel, Message::FilesystemReady { at_ns: monotonic_ns() });
    match read_frame(channel) {
        Ok(Some(Envelope { msg: Message::CgroupJoined, .. })) => {}
        Ok(_) | Err(_) => return Err("the host did not confirm the cgroup".to_owned()),
    }
    // Now that the agent is in the sandbox's cgroup, that cgroup becomes the root of its cgroup namespace, and what is
    // written from here on is charged to the sandbox.
    namespaces::enter_cgroup_namespace().map_err(|e| e.to_string())?;
    crate::guest::serve_root(plan, jail, channel, None)
}

/// True when the host's end of the channel is closed (the host died).
fn host_hung_up(channel: &UnixStream) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let mut fds = [PollFd::new(channel, PollFlags::RDHUP)];
    let zero = Timespec { tv_sec: 0, tv_nsec: 0 };
    matches!(poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
        && fds[0].revents().intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR)
}

fn build_sandbox(rootfs: &RootfsSpec) -> Result<(), sandkasten_jail::JailError> {
    namespaces::set_hostname("sandbox")?;
    net::bring_up_loopback()?;
    net::limit_tcp_buffers();
    let steps = plan_rootfs(rootfs, &RealHostFs);
    mounts::execute(&steps, rootfs.sandbox_uid, rootfs.sandbox_gid)?;
    mounts::pivot_into(&rootfs.new_root)
}
