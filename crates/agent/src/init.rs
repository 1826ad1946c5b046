//! The process tier's agent: it builds the sandbox from inside (hostname, loopback, the root filesystem, pivot_root),
//! answers `FilesystemReady`, waits for the host to place it in the sandbox's cgroup, then serves requests (a one-shot
//! run is one request like any other). The starter has already made it the root of its user namespace
//! and armed the parent-death signal before executing it (`sandkasten agent`); its plan came as the first frame.

#![allow(unsafe_code)]

use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use sandkasten_jail::process::ProcessJail;
use sandkasten_jail::rootfs::{RealHostFs, RootfsSpec, plan_rootfs, template_lowers};
use sandkasten_jail::{idmap, mounts, namespaces, net};
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
    // A template's lower layers come as idmapped mounts right after the plan (`idmap`): every one, or (a sandbox
    // that only reads them, on a host that cannot idmap its cache) none.
    let layer_mounts = if plan.template.capture.is_none() && plan.template.layers.is_empty() {
        Vec::new()
    } else {
        let count = template_lowers(&plan.template.layers, &RealHostFs).len();
        let optional = plan.template.capture.is_none();
        idmap::receive_fds(channel, count, optional).map_err(|e| e.to_string())?
    };
    let rootfs = RootfsSpec {
        new_root: PathBuf::from(NEW_ROOT),
        home: PathBuf::from(&plan.home),
        disk_bytes: plan.disk_bytes,
        sandbox_uid: plan.uid,
        sandbox_gid: plan.gid,
        files: plan.root_files.clone(),
        host_read_only: plan.vmm.iter().flat_map(|vmm| vmm.host_read_only.iter().map(PathBuf::from)).collect(),
        template: plan.template.clone(),
        agent_run_dir: plan.vmm.is_none(),
    };
    build_sandbox(&rootfs, layer_mounts).map_err(|e| e.to_string())?;
    send(channel, Message::FilesystemReady { at_ns: monotonic_ns() });
    match read_frame(channel) {
        Ok(Some(Envelope { msg: Message::CgroupJoined, .. })) => {}
        Ok(_) | Err(_) => return Err("the host did not confirm the cgroup".to_owned()),
    }
    // Now that the agent is in the sandbox's cgroup, that cgroup becomes the root of its cgroup namespace, and what is
    // written from here on is charged to the sandbox.
    namespaces::enter_cgroup_namespace().map_err(|e| e.to_string())?;
    match &plan.vmm {
        Some(vmm) => Err(become_vmm(vmm, jail)),
        None => crate::guest::serve_root(plan, jail, channel, None),
    }
}

/// The jail of a microVM's VMM: this process (the sandbox's PID 1, in its cgroup) becomes the VMM through the jail
/// (unprivileged ids, no capabilities, no_new_privs, landlock, seccomp), keeping the descriptors the host passed for
/// it. The host sees its channel close at the execve (close-on-exec), or `SetupFailed` with the returned reason.
fn become_vmm(vmm: &sandkasten_protocol::VmmPlan, jail: &ProcessJail<'_>) -> String {
    use sandkasten_jail::process::{PreparedExec, Stdio, contain_and_exec_keeping};
    for fd in &vmm.keep_fds {
        // SAFETY: fcntl on a descriptor the starter kept for the VMM; integers only.
        if unsafe { libc::fcntl(*fd, libc::F_SETFD, 0) } < 0 {
            return format!("the VMM's descriptor {fd} is not open: {}", std::io::Error::last_os_error());
        }
    }
    let env = std::collections::BTreeMap::from([("PATH".to_owned(), "/usr/bin:/bin".to_owned())]);
    let exec = match PreparedExec::new(&vmm.argv, &env) {
        Ok(exec) => exec,
        Err(error) => return format!("preparing the VMM: {error}"),
    };
    // Its input and output are /dev/null (the guest's console is a descriptor of its own); errors go to the log.
    let stdio = Stdio { stdin: 0, stdout: 0, stderr: vmm.stderr_fd, controlling_terminal: false };
    format!("starting the VMM: {}", contain_and_exec_keeping(jail, &exec, stdio, &vmm.keep_fds))
}

/// True when the host's end of the channel is closed (the host died).
fn host_hung_up(channel: &UnixStream) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let mut fds = [PollFd::new(channel, PollFlags::RDHUP)];
    let zero = Timespec { tv_sec: 0, tv_nsec: 0 };
    matches!(poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
        && fds[0].revents().intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR)
}

fn build_sandbox(
    rootfs: &RootfsSpec,
    layer_mounts: Vec<std::os::fd::OwnedFd>,
) -> Result<(), sandkasten_jail::JailError> {
    namespaces::set_hostname("sandbox")?;
    net::bring_up_loopback()?;
    net::limit_tcp_buffers();
    let steps = plan_rootfs(rootfs, &RealHostFs);
    mounts::execute(&steps, rootfs.sandbox_uid, rootfs.sandbox_gid, layer_mounts)?;
    mounts::pivot_into(&rootfs.new_root)
}
