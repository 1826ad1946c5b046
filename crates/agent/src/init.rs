//! The process tier's agent: it builds the sandbox from inside (hostname, loopback, the root filesystem, pivot_root),
//! waits for the host to place it in the sandbox's cgroup, then either serves requests or (one-shot) optionally
//! compiles, runs the program, reaps and reports. The starter has already made it the root of its user namespace
//! and armed the parent-death signal before executing it (`sandkasten agent`); its plan came as the first frame.

#![allow(unsafe_code)]

use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use sandkasten_jail::process::{ProcessJail, Stdio};
use sandkasten_jail::rootfs::{RealHostFs, RootfsSpec, SandboxFile, plan_rootfs};
use sandkasten_jail::{mounts, namespaces, net};
use sandkasten_protocol::{AgentMode, AgentPlan, Envelope, Message, monotonic_ns, read_frame, write_frame};

use crate::reaper::{self, ExitStatus};
use crate::step::{self, Started};

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

/// Builds the sandbox and runs or serves it, as `plan` says.
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
    let (compile, program, stdio) = match &plan.mode {
        AgentMode::Serve => return crate::guest::serve_root(plan, jail, channel),
        AgentMode::OneShot { compile, program, stdio: [stdin, stdout, stderr] } => {
            (compile, program, Stdio { stdin: *stdin, stdout: *stdout, stderr: *stderr })
        }
    };
    receive_uploads(plan, channel)?;

    if let Some(compile) = compile {
        let status = match step::start(jail, compile, &plan.env, stdio) {
            Started::Running(pid) => reaper::wait_for(pid),
            Started::Failed(message) => {
                send(channel, Message::ExecFailed { message });
                return Ok(());
            }
        };
        if !status.success() {
            send(channel, Message::CompileFailed { exit_code: status.exit_code, signal: status.signal });
            return Ok(());
        }
    }

    let status = match step::start(jail, program, &plan.env, stdio) {
        Started::Running(pid) => {
            send(channel, Message::ProgramStarted { at_ns: monotonic_ns(), pid: pid as u32 });
            close_stdio(stdio);
            reaper::wait_for(pid)
        }
        Started::Failed(message) => {
            send(channel, Message::ExecFailed { message });
            return Ok(());
        }
    };
    let ExitStatus { exit_code, signal } = status;
    let disk_full = [plan.home.as_str(), "/tmp", "/dev/shm"].into_iter().any(crate::serve::output::is_full);
    send(channel, Message::Exited { exit_code, signal, disk_full });
    Ok(())
}

/// Writes the one-shot run's uploads as their `FileWrite` frames arrive (owned by the sandbox user), until
/// `UploadsDone`.
fn receive_uploads(plan: &AgentPlan, channel: &mut UnixStream) -> Result<(), String> {
    use base64::Engine as _;
    loop {
        match read_frame(channel) {
            Ok(Some(Envelope { msg: Message::UploadsDone, .. })) => return Ok(()),
            Ok(Some(Envelope { msg: Message::FileWrite { path, data, append, mode }, .. })) => {
                let contents = base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .map_err(|e| format!("upload {path}: bad base64: {e}"))?;
                if append {
                    use std::io::Write as _;
                    std::fs::OpenOptions::new()
                        .append(true)
                        .open(&path)
                        .and_then(|mut file| file.write_all(&contents))
                        .map_err(|e| format!("writing the upload {path}: {e}"))?;
                } else {
                    let file = SandboxFile {
                        path: PathBuf::from(&path),
                        contents,
                        mode: mode.unwrap_or(0o644) & 0o777,
                        owned_by_sandbox_user: true,
                    };
                    mounts::write_files(&[file], plan.uid, plan.gid).map_err(|e| e.to_string())?;
                }
            }
            Ok(_) | Err(_) => return Err("the host did not send the uploads".to_owned()),
        }
    }
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
    let steps = plan_rootfs(rootfs, &RealHostFs);
    mounts::execute(&steps, rootfs.sandbox_uid, rootfs.sandbox_gid)?;
    mounts::pivot_into(&rootfs.new_root)
}

/// The agent's copies of the program's streams must close, or the host would never see end-of-file.
fn close_stdio(stdio: Stdio) {
    for fd in [stdio.stdin, stdio.stdout, stdio.stderr] {
        if fd > 2 {
            // SAFETY: these descriptors were inherited for the program, which has its own copies now.
            unsafe { libc::close(fd) };
        }
    }
}
