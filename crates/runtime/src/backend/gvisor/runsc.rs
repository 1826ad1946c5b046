//! Starting runsc for one sandbox. `run` (a new sandbox) and `restore` (one from its checkpoint image) start the same
//! way: in the sandbox's cgroup (so runsc, the Sentry and the gofer are charged to it and die with it), with SIGKILL
//! as parent-death signal, in a mount namespace of their own where every host path the sandbox binds is read-only at
//! the host kernel's level, with a clean environment, and with one end of a new socketpair as the container's stdin
//! (the agent's channel; on a restore runsc hands the new descriptor to the restored init in place of the old one).
//! A built template's overlay is mounted in that namespace too.

#![allow(unsafe_code)]

use std::ffi::{CString, OsString};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use super::{GvisorFiles, resolve_runsc, runsc_missing, runsc_root};
use crate::config::RuntimeConfig;
use crate::error::RuntimeError;
use crate::guard::SandboxGuard;

/// How every checkpoint is written: uncompressed (a restore reads the pages straight into the memory file instead of
/// inflating them through the Sentry's heap, which stayed charged to the sandbox's memory limit) and without pages
/// that were committed but hold only zeros.
pub(super) const CHECKPOINT_FLAGS: [&str; 2] = ["--compression=none", "--exclude-committed-zero-pages"];

/// Starts `runsc <global flags> <subcommand…> ID` for the sandbox of `guard` (whose cgroup exists) and returns the
/// host end of its channel; `guard.init_pid` is runsc's pid from then on (reaped by the guard's owner). runsc writes
/// its log to `runsc.log` in the bundle.
pub(super) fn start(
    config: &RuntimeConfig,
    guard: &mut SandboxGuard,
    files: &GvisorFiles,
    subcommand: &[OsString],
) -> Result<UnixStream, RuntimeError> {
    let read_only: Vec<CString> = files
        .read_only
        .iter()
        .filter_map(|path| CString::new(path.clone().into_os_string().into_encoded_bytes()).ok())
        .collect();
    let (channel, agent_end) = UnixStream::pair().map_err(|e| RuntimeError::sys("socketpair", e))?;
    let log_path = files.bundle.join("runsc.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| RuntimeError::sys_owned(format!("opening {}", log_path.display()), e))?;
    let procs: Vec<CString> = guard
        .cgroup()?
        .paths()
        .iter()
        .filter_map(|dir| CString::new(dir.join("cgroup.procs").into_os_string().into_encoded_bytes()).ok())
        .collect();
    let template = match &files.template {
        Some(options) => {
            let point = CString::new(files.template_mount_point().into_os_string().into_encoded_bytes());
            match (point, CString::new(options.as_str())) {
                (Ok(point), Ok(options)) => Some((point, options)),
                _ => return Err(RuntimeError::InvalidInput("a template layer path with a NUL byte".to_owned())),
            }
        }
        None => None,
    };
    let Ok(oom_score) = CString::new(super::oom::raised_score()) else {
        return Err(RuntimeError::Runsc("an OOM score with a NUL byte".to_owned()));
    };
    let runsc = resolve_runsc(config).ok_or_else(|| RuntimeError::HostUnsupported(runsc_missing(config)))?;
    // Before the first Sentry can read runsc's code into the page cache on its sandbox's account (`resident`).
    super::resident::pin(&runsc);
    let mut command = Command::new(&runsc);
    command
        .arg(format!("--root={}", runsc_root(config).display()))
        .arg("--network=none")
        .arg(format!("--platform={}", config.gvisor.platform.name()))
        .arg("--ignore-cgroups")
        // The Sentry may connect to host unix sockets bound into the sandbox only where there is one: the door.
        .args(files.door.then_some("--host-uds=open"))
        .arg("--overlay2=none")
        .args(subcommand)
        .arg(&guard.id)
        // Nothing of the owner's environment (API keys, tokens) may reach runsc or the gofer, host processes in the
        // sandbox's cgroup.
        .env_clear()
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(agent_end)))
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .process_group(0);
    // SAFETY: the closure runs in the forked child before execve and only makes async-signal-safe calls (open,
    // write, close, prctl, unshare, mount) on data prepared before the fork.
    unsafe {
        command.pre_exec(move || {
            join_cgroup_and_die_with_parent(&procs)?;
            raise_oom_score(&oom_score)?;
            read_only_sources(&read_only)?;
            mount_template(template.as_ref())
        });
    }
    let spawned = command.spawn();
    // The command holds the container's end of the channel: drop it now, or a runsc that dies at once would leave
    // the channel open and be noticed only at the ready timeout.
    drop(command);
    let child = spawned.map_err(|e| {
        RuntimeError::sys_owned(format!("starting {} (install it with scripts/setup.sh)", runsc.display()), e)
    })?;
    guard.init_pid = Some(child.id());
    // The child is reaped by whoever owns the guard (waitpid on `init_pid`), not through `Child`.
    drop(child);
    Ok(channel)
}

/// In the forked child: joins every cgroup directory of the sandbox (writing 0 = "this process"), then asks for
/// SIGKILL when the parent (the spawner, or the one-shot CLI) dies.
fn join_cgroup_and_die_with_parent(procs: &[CString]) -> std::io::Result<()> {
    for path in procs {
        // SAFETY: open/write/close on a NUL-terminated path prepared before the fork; async-signal-safe.
        let ok = unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            let written = fd >= 0 && libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
            if fd >= 0 {
                libc::close(fd);
            }
            written
        };
        if !ok {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// In the forked child, in the mount namespace `read_only_sources` made: the template's read-only overlay at its mount
/// point in the bundle (`point`, `options`), which the bundle binds at `/opt`. It ends with runsc's processes.
fn mount_template(template: Option<&(CString, CString)>) -> std::io::Result<()> {
    let Some((point, options)) = template else { return Ok(()) };
    let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
    // SAFETY: mount takes NUL-terminated strings prepared before the fork and integer flags; async-signal-safe.
    let mounted = unsafe {
        libc::mount(c"overlay".as_ptr(), point.as_ptr(), c"overlay".as_ptr(), flags, options.as_ptr().cast())
    };
    if mounted == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// In the forked child: the OOM score runsc and everything it starts inherit (`oom::raised_score`; the Sentry and
/// the gofer are set back once the sandbox runs, the stubs keep it).
fn raise_oom_score(score: &CString) -> std::io::Result<()> {
    let path = c"/proc/self/oom_score_adj";
    let bytes = score.as_bytes();
    // SAFETY: open/write/close on a NUL-terminated path and a buffer prepared before the fork; async-signal-safe.
    let ok = unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        let written = fd >= 0 && libc::write(fd, bytes.as_ptr().cast(), bytes.len()) == bytes.len() as isize;
        if fd >= 0 {
            libc::close(fd);
        }
        written
    };
    if ok { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// In the forked child, before runsc executes: a mount namespace of its own in which every host path the sandbox
/// binds is read-only at the host kernel's level (a bind onto itself, remounted read-only), so neither the gofer nor
/// a compromised Sentry can open one for writing. Nothing is mounted in the host's namespace: the namespace and
/// its mounts end with runsc's processes.
fn read_only_sources(paths: &[CString]) -> std::io::Result<()> {
    let fail = || Err(std::io::Error::last_os_error());
    // SAFETY: unshare and mount take NUL-terminated paths prepared before the fork (or null) and integer flags;
    // they are async-signal-safe system calls.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return fail();
        }
        let root = c"/";
        if libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            return fail();
        }
        for path in paths {
            let bind = libc::MS_BIND | libc::MS_REC;
            if libc::mount(path.as_ptr(), path.as_ptr(), std::ptr::null(), bind, std::ptr::null()) != 0 {
                return fail();
            }
            let read_only = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
            if libc::mount(std::ptr::null(), path.as_ptr(), std::ptr::null(), read_only, std::ptr::null()) != 0 {
                return fail();
            }
        }
    }
    Ok(())
}
