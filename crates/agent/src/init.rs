//! The agent's main sequence: wait for the host's go, build the sandbox, then either (one-shot) optionally compile,
//! run the program, reap, report, or (serve) answer the host's requests; then exit, which kills everything left in
//! the pid namespace.

#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;

use sandkasten_jail::process::{ProcessJail, Stdio};
use sandkasten_jail::rootfs::{RealHostFs, RootfsSpec, SandboxFile, plan_rootfs};
use sandkasten_jail::{mounts, namespaces, net};
use sandkasten_protocol::{Envelope, Message, monotonic_ns, read_frame, write_frame};

use crate::reaper::{self, ExitStatus};
use crate::serve::{self, FsIdentity, JailLauncher, SandboxRoot, ServeContext};
use crate::step::{self, Started};

/// What the agent does once the sandbox is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AgentMode {
    /// Run `compile` (if any) and `program`, report `Exited`, exit.
    #[default]
    OneShot,
    /// Serve the host's requests (commands, files) until `Shutdown` or until the host goes away; `compile`,
    /// `program` and `stdio` are not used (the agent closes `stdio`), `env` is every command's base environment and
    /// `jail` confines every command (its `cwd` is replaced by the command's).
    Serve,
}

/// Everything the agent needs, prepared by the host before the clone (the agent gets a copy of it).
pub struct InitPlan<'a> {
    /// One execution, or a long-lived sandbox.
    pub mode: AgentMode,
    /// The root filesystem to build.
    pub rootfs: RootfsSpec,
    /// Files written after joining the cgroup (uploads).
    pub uploads: Vec<SandboxFile>,
    /// The uts namespace's hostname.
    pub hostname: String,
    /// A compile step run before the program (C); its failure is reported as `CompileFailed`.
    pub compile: Option<Vec<String>>,
    /// The program and its arguments.
    pub program: Vec<String>,
    /// The program's complete environment.
    pub env: BTreeMap<String, String>,
    /// How the program is confined.
    pub jail: ProcessJail<'a>,
    /// The program's standard streams (descriptors inherited from the host).
    pub stdio: Stdio,
    /// Writable filesystems checked for fullness when the program ends.
    pub writable_mounts: Vec<&'a Path>,
}

fn send(channel: &mut UnixStream, msg: Message) {
    // A failed send means the host is gone; the agent then dies by its parent-death signal or ends on its own.
    let _ = write_frame(channel, &Envelope::new(0, msg));
}

fn unblock_all_signals() {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it and sigprocmask reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
}

/// Runs the agent and exits the process; never returns. `channel` is the agent's end of the host socketpair.
pub fn run_init(plan: &InitPlan<'_>, channel: OwnedFd) -> ! {
    unblock_all_signals();
    crate::scrub::wipe_inherited_argv_and_environment();
    let mut channel = UnixStream::from(channel);
    let code = match run(plan, &mut channel) {
        Ok(()) => 0,
        Err(message) => {
            send(&mut channel, Message::SetupFailed { message });
            1
        }
    };
    // SAFETY: _exit ends PID 1 at once; the kernel then kills every process left in the pid namespace.
    unsafe { libc::_exit(code) }
}

fn run(plan: &InitPlan<'_>, channel: &mut UnixStream) -> Result<(), String> {
    match read_frame(channel) {
        Ok(Some(Envelope { msg: Message::Start, .. })) => {}
        Ok(_) | Err(_) => return Err("the host did not send start".to_owned()),
    }
    // Credentials change first: the kernel clears the parent-death signal on every change of ids, so it is armed
    // after becoming the namespace's root, and the host is checked again in case it died in between.
    namespaces::become_namespace_root().map_err(|e| e.to_string())?;
    namespaces::die_with_parent(0).map_err(|e| e.to_string())?;
    if host_hung_up(channel) {
        return Err("the host exited before the sandbox was built".to_owned());
    }
    build_sandbox(plan).map_err(|e| e.to_string())?;
    send(channel, Message::FilesystemReady { at_ns: monotonic_ns() });
    match read_frame(channel) {
        Ok(Some(Envelope { msg: Message::CgroupJoined, .. })) => {}
        Ok(_) | Err(_) => return Err("the host did not confirm the cgroup".to_owned()),
    }
    // Now that the agent is in the sandbox's cgroup, that cgroup becomes the root of its cgroup namespace, and what is
    // written from here on is charged to the sandbox.
    namespaces::enter_cgroup_namespace().map_err(|e| e.to_string())?;
    mounts::write_files(&plan.uploads, plan.rootfs.sandbox_uid, plan.rootfs.sandbox_gid).map_err(|e| e.to_string())?;
    if plan.mode == AgentMode::Serve {
        close_stdio(plan.stdio);
        return serve_until_shutdown(plan, channel);
    }

    if let Some(compile) = &plan.compile {
        let status = match step::start(&plan.jail, compile, &plan.env, plan.stdio) {
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

    let status = match step::start(&plan.jail, &plan.program, &plan.env, plan.stdio) {
        Started::Running(pid) => {
            send(channel, Message::ProgramStarted { at_ns: monotonic_ns(), pid: pid as u32 });
            close_stdio(plan.stdio);
            reaper::wait_for(pid)
        }
        Started::Failed(message) => {
            send(channel, Message::ExecFailed { message });
            return Ok(());
        }
    };
    let ExitStatus { exit_code, signal } = status;
    let disk_full = plan.writable_mounts.iter().any(|mount| is_full(mount));
    send(channel, Message::Exited { exit_code, signal, disk_full });
    Ok(())
}

/// Serve mode: the root is `/` (pivoted into), file operations take the sandbox user's identity, commands go
/// through the jail.
fn serve_until_shutdown(plan: &InitPlan<'_>, channel: &UnixStream) -> Result<(), String> {
    let identity = FsIdentity { uid: plan.jail.uid, gid: plan.jail.gid };
    let root =
        SandboxRoot::open(Path::new("/"), Some(identity)).map_err(|e| format!("opening the sandbox root: {e}"))?;
    let stream = channel.try_clone().map_err(|e| format!("duplicating the channel: {e}"))?;
    let launcher = JailLauncher::new(&plan.jail);
    let home = plan.jail.cwd.to_str().ok_or("the sandbox home is not UTF-8")?;
    let context = ServeContext { root, base_env: &plan.env, launcher: &launcher, home };
    serve::serve(stream, &context).map(drop).map_err(|e| format!("serve loop: {e}"))
}

/// True when the host's end of the channel is closed (the host died).
fn host_hung_up(channel: &UnixStream) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let mut fds = [PollFd::new(channel, PollFlags::RDHUP)];
    let zero = Timespec { tv_sec: 0, tv_nsec: 0 };
    matches!(poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
        && fds[0].revents().intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR)
}

fn build_sandbox(plan: &InitPlan<'_>) -> Result<(), sandkasten_jail::JailError> {
    namespaces::set_hostname(&plan.hostname)?;
    net::bring_up_loopback()?;
    let steps = plan_rootfs(&plan.rootfs, &RealHostFs);
    mounts::execute(&steps, plan.rootfs.sandbox_uid, plan.rootfs.sandbox_gid)?;
    mounts::pivot_into(&plan.rootfs.new_root)
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

/// A filesystem counts as full when less than 64 KiB or 1 % of it is left.
fn is_full(mount: &Path) -> bool {
    match rustix::fs::statvfs(mount) {
        Ok(stat) => {
            let available = stat.f_bavail.saturating_mul(stat.f_frsize);
            let total = stat.f_blocks.saturating_mul(stat.f_frsize);
            total > 0 && (available < 64 << 10 || available.saturating_mul(100) < total)
        }
        Err(_) => false,
    }
}
