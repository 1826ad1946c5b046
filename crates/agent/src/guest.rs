//! The agent's entry point as its own executable (`sandkasten agent`). Its channel is a connected stream on
//! descriptor 0; the first frame is the host's `Plan`, which says everything the agent needs (nothing reaches it
//! through shared memory). What follows depends on the tier: the process tier's agent builds the sandbox's root itself
//! (`init`), a gVisor agent serves the root runsc gave it (`serve_given_root` below). Exiting ends the sandbox.

#![allow(unsafe_code)]

use std::io::Write as _;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use sandkasten_jail::process::ProcessJail;
use sandkasten_jail::rlimits::ProcessRlimits;
use sandkasten_jail::seccomp::SandboxFilter;
use sandkasten_protocol::{AgentPlan, Envelope, Message, SeccompPolicy, monotonic_ns, read_frame, write_frame};
use sandkasten_types::Tier;

use crate::serve::{self, FsIdentity, HostConnections, JailLauncher, SandboxRoot, ServeContext};

/// Runs the agent on descriptor 0 and exits the process; never returns.
pub fn run_agent() -> ! {
    crate::init::unblock_all_signals();
    if std::env::args_os().nth(2).is_some_and(|mode| mode == "microvm") {
        // A microVM guest's PID 1: its channel is a virtio-serial port, made descriptor 0 here. What fails before
        // the channel exists can only be said on the console (the kernel log the host keeps).
        if let Err(message) = crate::microvm::open_channel() {
            eprintln!("sandkasten agent: {message}");
            // SAFETY: _exit ends PID 1; the guest kernel panics and QEMU (-no-reboot) exits.
            unsafe { libc::_exit(1) }
        }
    }
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
    // SAFETY: dup2 onto descriptor 0 of this process; `null` stays valid for the call.
    unsafe {
        libc::dup2(null.as_raw_fd(), 0);
    }
    Ok(UnixStream::from(channel))
}

fn run(channel: &mut UnixStream) -> Result<(), String> {
    let plan = match read_frame(channel) {
        Ok(Some(Envelope { msg: Message::Plan { plan }, .. })) => *plan,
        Ok(_) => return Err("the host did not send the plan".to_owned()),
        Err(error) => return Err(format!("reading the plan: {error}")),
    };
    let filter = match plan.seccomp {
        SeccompPolicy::Sandbox => SandboxFilter::compile(),
        SeccompPolicy::Vmm => SandboxFilter::compile_vmm(),
    }
    .map_err(|e| format!("compiling the seccomp policy: {e}"))?;
    let jail = jail_of(&plan, &filter);
    match plan.tier {
        Tier::Process => crate::init::run(&plan, &jail, channel),
        Tier::Microvm => {
            crate::microvm::build_root(&plan)?;
            serve_given_root(&plan, &jail, channel)
        }
        _ => serve_given_root(&plan, &jail, channel),
    }
}

/// How every command of the sandbox is confined (its `cwd` is replaced by each command's own).
fn jail_of<'a>(plan: &AgentPlan, filter: &'a SandboxFilter) -> ProcessJail<'a> {
    ProcessJail {
        uid: plan.uid,
        gid: plan.gid,
        rlimits: ProcessRlimits { processes: plan.processes, ..ProcessRlimits::for_disk(plan.disk_bytes) },
        writable_dirs: plan.writable_dirs.iter().map(PathBuf::from).collect(),
        writable_files: plan.writable_files.iter().map(PathBuf::from).collect(),
        cwd: PathBuf::from(&plan.home),
        filter,
        oom_score_adj: plan.oom_score_adj,
    }
}

/// Serves the host's requests in a root someone else made (gVisor; a microVM guest's, finished by `microvm`): ready the home, open the egress door, answer
/// `FilesystemReady`, serve.
fn serve_given_root(plan: &AgentPlan, jail: &ProcessJail<'_>, channel: &mut UnixStream) -> Result<(), String> {
    ready_home(plan)?;
    let door = match &plan.door {
        Some(door) => Some(
            crate::door::Door::open(door).map_err(|e| format!("opening the egress door on port {}: {e}", door.port))?,
        ),
        None => None,
    };
    write_frame(channel, &Envelope::new(0, Message::FilesystemReady { at_ns: monotonic_ns() }))
        .map_err(|e| format!("answering the host: {e}"))?;
    serve_root(plan, jail, channel, door.as_ref().map(|door| door as &dyn HostConnections))
}

/// Serve mode over `/` (the sandbox's root): file operations take the sandbox user's identity, commands go through
/// the jail.
pub(crate) fn serve_root(
    plan: &AgentPlan,
    jail: &ProcessJail<'_>,
    channel: &UnixStream,
    host_connections: Option<&dyn HostConnections>,
) -> Result<(), String> {
    let identity = FsIdentity { uid: plan.uid, gid: plan.gid };
    let root = SandboxRoot::open(Path::new("/"), Some(identity)).map_err(|e| format!("opening the root: {e}"))?;
    write_home_files(&root, &plan.home_files)?;
    let workdir = plan.template.workdir.as_deref().unwrap_or(&plan.home);
    make_workdir(&root, workdir);
    let launcher = JailLauncher::new(jail);
    let context = ServeContext {
        root,
        base_env: &plan.env,
        launcher: &launcher,
        home: &plan.home,
        workdir,
        disk_bytes: plan.disk_bytes,
        host_connections,
    };
    let stream = channel.try_clone().map_err(|e| format!("duplicating the channel: {e}"))?;
    serve::serve(stream, &context).map(drop).map_err(|e| format!("serve loop: {e}"))
}

/// Creates the plan's home files (the user's skeleton) as the sandbox user, each only where nothing is yet: a file
/// already there (a restored home's own) is kept.
fn write_home_files(root: &SandboxRoot, files: &[sandkasten_types::SandboxFile]) -> Result<(), String> {
    use rustix::fs::{Mode, OFlags};
    for file in files {
        let path = file.path.to_string_lossy();
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW;
        let created = root.as_sandbox_user(|| root.open_in_root(&path, flags, Mode::from_raw_mode(file.mode & 0o777)));
        match created {
            Ok(fd) => std::fs::File::from(fd)
                .write_all(&file.contents)
                .map_err(|e| format!("writing {path} into the home: {e}"))?,
            Err(failure) if failure.kind == sandkasten_types::FailureKind::AlreadyExists => {}
            Err(failure) => return Err(format!("creating {path} in the home: {}", failure.message)),
        }
    }
    Ok(())
}

/// Creates a built template's working directory where it is missing, as the sandbox user (so only where that user
/// may write: the home, `/tmp`). Best effort: one it cannot create (under the read-only `/opt`) makes each command
/// that names no directory fail saying the directory does not exist.
fn make_workdir(root: &SandboxRoot, workdir: &str) {
    match root.as_sandbox_user(|| Ok(std::fs::create_dir_all(workdir))) {
        Ok(Ok(())) => {}
        Ok(Err(error)) => eprintln!("sandkasten-agent: creating the template's working directory {workdir}: {error}"),
        Err(failure) => eprintln!("sandkasten-agent: creating {workdir} as the sandbox user: {}", failure.message),
    }
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
