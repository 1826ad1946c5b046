//! The agent as its own executable (`sandkasten agent`): the init of a sandbox whose root and namespaces were made by
//! someone else (runsc, a VMM). Its channel is a connected stream on descriptor 0; the first frame is the host's
//! `Plan`. The agent then readies the home, opens the egress door if the plan has one, answers `FilesystemReady` and
//! serves until the host goes away; exiting ends the sandbox.

#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use sandkasten_jail::process::ProcessJail;
use sandkasten_jail::rlimits::ProcessRlimits;
use sandkasten_jail::seccomp::SandboxFilter;
use sandkasten_protocol::{AgentPlan, Envelope, Message, SeccompPolicy, monotonic_ns, read_frame, write_frame};

use crate::serve::{self, FsIdentity, JailLauncher, SandboxRoot, ServeContext};

/// Runs the guest agent on descriptor 0 and exits the process; never returns.
pub fn run_guest() -> ! {
    crate::scrub::wipe_inherited_argv_and_environment();
    let code = match take_channel() {
        Ok(mut channel) => match run(&mut channel) {
            Ok(()) => 0,
            Err(message) => {
                let _ = write_frame(&mut channel, &Envelope::new(0, Message::SetupFailed { message }));
                1
            }
        },
        Err(_) => 1,
    };
    // SAFETY: _exit ends the init at once; the sandbox's kernel then ends every process left in it.
    unsafe { libc::_exit(code) }
}

/// Moves the channel off descriptor 0 (close-on-exec, so no command inherits it) and puts `/dev/null` there.
fn take_channel() -> std::io::Result<UnixStream> {
    // SAFETY: F_DUPFD_CLOEXEC on descriptor 0, which the starter gave us as the channel; the new descriptor is ours.
    let fd = unsafe { libc::fcntl(0, libc::F_DUPFD_CLOEXEC, 3) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created above and is owned by nothing else.
    let channel = unsafe { OwnedFd::from_raw_fd(fd) };
    let null = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null")?;
    // SAFETY: dup2 onto the standard descriptors of this process; `null` stays valid for the call.
    unsafe {
        libc::dup2(null.as_raw_fd(), 0);
    }
    Ok(UnixStream::from(channel))
}

fn run(channel: &mut UnixStream) -> Result<(), String> {
    let plan = match read_frame(channel) {
        Ok(Some(Envelope { msg: Message::Plan { plan }, .. })) => plan,
        Ok(_) => return Err("the host did not send the plan".to_owned()),
        Err(error) => return Err(format!("reading the plan: {error}")),
    };
    let filter = match plan.seccomp {
        SeccompPolicy::Sandbox => SandboxFilter::compile().map_err(|e| format!("compiling the seccomp policy: {e}"))?,
    };
    ready_home(&plan)?;
    if let Some(door) = &plan.door {
        crate::door::open(door).map_err(|e| format!("opening the egress door on port {}: {e}", door.port))?;
    }
    let jail = ProcessJail {
        uid: plan.uid,
        gid: plan.gid,
        rlimits: ProcessRlimits::for_disk(plan.disk_bytes),
        writable_dirs: plan.writable_dirs.iter().map(PathBuf::from).collect(),
        writable_files: plan.writable_files.iter().map(PathBuf::from).collect(),
        cwd: PathBuf::from(&plan.home),
        filter: &filter,
        oom_score_adj: 0,
    };
    let identity = FsIdentity { uid: plan.uid, gid: plan.gid };
    let root = SandboxRoot::open(Path::new("/"), Some(identity)).map_err(|e| format!("opening the root: {e}"))?;
    let launcher = JailLauncher::new(&jail);
    let context = ServeContext { root, base_env: &plan.env, launcher: &launcher, home: &plan.home };
    write_frame(channel, &Envelope::new(0, Message::FilesystemReady { at_ns: monotonic_ns() }))
        .map_err(|e| format!("answering the host: {e}"))?;
    let stream = channel.try_clone().map_err(|e| format!("duplicating the channel: {e}"))?;
    serve::serve(stream, &context).map(drop).map_err(|e| format!("serve loop: {e}"))
}

/// The home is a fresh tmpfs of the sandbox's (root-owned when the starter mounted it): hand it to the sandbox user.
fn ready_home(plan: &AgentPlan) -> Result<(), String> {
    rustix::fs::chown(
        plan.home.as_str(),
        Some(rustix::fs::Uid::from_raw(plan.uid)),
        Some(rustix::fs::Gid::from_raw(plan.gid)),
    )
    .map_err(|e| format!("handing {} to the sandbox user: {e}", plan.home))?;
    rustix::fs::chmod(plan.home.as_str(), rustix::fs::Mode::from_raw_mode(0o755))
        .map_err(|e| format!("setting the mode of {}: {e}", plan.home))
}
