//! Tests of serve mode without namespaces: a forked child runs the real loop with a plain fork + exec launcher and
//! a temporary directory as its root, and the test drives it with frames over a socketpair, like the host does.

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

mod commands;
mod files;
mod terminal;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use sandkasten_protocol::{Envelope, FrameDecoder, Message, write_frame};
use sandkasten_types::CommandExit;
use sandkasten_types::StreamKind;

use super::{FsIdentity, LaunchRequest, Launcher, SandboxRoot, ServeContext, serve};

/// Starts commands with fork + setsid + dup2 + fchdir + execvpe, reporting exec failures through a close-on-exec
/// pipe like the jail does.
struct ForkExecLauncher;

impl Launcher for ForkExecLauncher {
    fn launch(&self, request: &LaunchRequest<'_>) -> Result<libc::pid_t, String> {
        let cstr = |s: &str| CString::new(s).map_err(|_| "NUL byte".to_owned());
        let argv: Vec<CString> = request.argv.iter().map(|a| cstr(a)).collect::<Result<_, _>>()?;
        let envp: Vec<CString> =
            request.env.iter().map(|(k, v)| cstr(&format!("{k}={v}"))).collect::<Result<_, _>>()?;
        let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
        argv_ptrs.push(std::ptr::null());
        let mut envp_ptrs: Vec<*const libc::c_char> = envp.iter().map(|e| e.as_ptr()).collect();
        envp_ptrs.push(std::ptr::null());
        let (error_read, error_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
        // SAFETY: the serve loop runs in a forked, single-threaded test child.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let error_fd = error_write.as_raw_fd();
            // SAFETY: plain system calls on valid descriptors and NUL-terminated arrays prepared before the fork.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                libc::setsid();
                libc::dup2(request.stdio.stdin, 0);
                libc::dup2(request.stdio.stdout, 1);
                libc::dup2(request.stdio.stderr, 2);
                if request.stdio.controlling_terminal {
                    libc::ioctl(0, libc::TIOCSCTTY, 0);
                }
                libc::fchdir(request.cwd.as_raw_fd());
                libc::syscall(libc::SYS_close_range, 3u32, (error_fd - 1) as u32, 0u32);
                libc::syscall(libc::SYS_close_range, (error_fd + 1) as u32, u32::MAX, 0u32);
                libc::execvpe(argv[0].as_ptr(), argv_ptrs.as_ptr(), envp_ptrs.as_ptr());
                let message = format!("{}: {}", request.argv[0], std::io::Error::last_os_error());
                libc::write(error_fd, message.as_ptr().cast(), message.len());
                libc::_exit(127);
            }
        }
        drop(error_write);
        let mut message = String::new();
        std::fs::File::from(error_read).read_to_string(&mut message).unwrap();
        if message.is_empty() {
            Ok(pid)
        } else {
            crate::reaper::wait_for_child(pid);
            Err(message)
        }
    }
}

/// A serve loop in a forked child, with its temporary root.
pub struct TestAgent {
    channel: UnixStream,
    decoder: FrameDecoder,
    pid: libc::pid_t,
    pub root: tempfile::TempDir,
    /// Frames received while waiting for another id.
    pub stash: Vec<Envelope>,
}

/// The sandbox user when the tests run as root (file operations then take its identity), else none.
pub fn test_identity() -> Option<FsIdentity> {
    rustix::process::geteuid().is_root().then_some(FsIdentity { uid: 1000, gid: 1000 })
}

impl TestAgent {
    /// A root with `/workspace` (owned by the sandbox user when running as root) and a forked agent serving it.
    pub fn start() -> TestAgent {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("workspace")).unwrap();
        if let Some(identity) = test_identity() {
            for dir in [root.path().to_path_buf(), root.path().join("workspace")] {
                std::os::unix::fs::chown(&dir, Some(identity.uid), Some(identity.gid)).unwrap();
            }
        }
        let (ours, theirs) = UnixStream::pair().unwrap();
        // SAFETY: the child only runs the serve loop and then _exits; it never returns into the test harness.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            drop(ours);
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_child(root.path(), theirs)))
                .map_or(101, |ok| if ok { 0 } else { 1 });
            // SAFETY: ends the forked child without running the harness's destructors (the TempDir is the parent's).
            unsafe { libc::_exit(code) };
        }
        drop(theirs);
        ours.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        TestAgent { channel: ours, decoder: FrameDecoder::new(), pid, root, stash: Vec::new() }
    }

    /// The host path of a sandbox path.
    pub fn host_path(&self, sandbox_path: &str) -> std::path::PathBuf {
        self.root.path().join(sandbox_path.trim_start_matches('/'))
    }

    /// The raw channel, for malformed frames.
    pub fn channel_mut(&mut self) -> &mut UnixStream {
        &mut self.channel
    }

    pub fn send(&mut self, id: u64, msg: Message) {
        write_frame(&mut self.channel, &Envelope::new(id, msg)).unwrap();
    }

    /// The next frame from the agent (any id), or `None` after `within`.
    pub fn recv_within(&mut self, within: Duration) -> Option<Envelope> {
        let give_up = Instant::now() + within;
        let mut buffer = vec![0u8; 256 << 10];
        loop {
            if let Some(envelope) = self.decoder.next_envelope().unwrap() {
                return Some(envelope);
            }
            if Instant::now() >= give_up {
                return None;
            }
            match self.channel.read(&mut buffer) {
                Ok(0) => return None,
                Ok(n) => self.decoder.push(&buffer[..n]),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => panic!("reading from the agent: {e}"),
            }
        }
    }

    /// The next frame for `id` (others are stashed).
    pub fn recv_for(&mut self, id: u64) -> Message {
        if let Some(at) = self.stash.iter().position(|e| e.id == id) {
            return self.stash.remove(at).msg;
        }
        loop {
            let envelope = self.recv_within(Duration::from_secs(20)).expect("the agent answered in time");
            if envelope.id == id {
                return envelope.msg;
            }
            self.stash.push(envelope);
        }
    }

    /// Sends a request and returns its reply: the first message for `id` that is not a command's `Output` or
    /// `ExecExited` (those are kept, in order, for `collect`).
    pub fn request(&mut self, id: u64, msg: Message) -> Message {
        self.send(id, msg);
        let mut kept = Vec::new();
        let reply = loop {
            match self.recv_for(id) {
                streamed @ (Message::Output { .. } | Message::ExecExited { .. }) => kept.push(streamed),
                reply => break reply,
            }
        };
        let at = self.stash.len();
        self.stash.splice(at..at, kept.into_iter().map(|msg| Envelope::new(id, msg)));
        // The kept frames come before anything stashed later, but after frames of other ids: order per id holds.
        reply
    }

    /// Reads and discards frames until `ExecExited` for `id`; returns it and the bytes of output discarded.
    pub fn discard_until_exit(&mut self, id: u64) -> (CommandExit, usize) {
        self.stash.retain(|e| e.id != id || !matches!(e.msg, Message::Output { .. }));
        let mut discarded = 0;
        loop {
            match self.recv_for(id) {
                Message::Output { data, .. } => discarded += data.len() / 4 * 3,
                Message::ExecExited { exit } => return (exit, discarded),
                _ => {}
            }
        }
    }

    /// Collects a command's output until its `ExecExited`.
    pub fn collect(&mut self, id: u64) -> Finished {
        let mut finished = Finished::default();
        loop {
            match self.recv_for(id) {
                Message::Output { stream, data } => {
                    let bytes = STANDARD.decode(data).unwrap();
                    match stream {
                        StreamKind::Stdout => finished.stdout.extend(bytes),
                        StreamKind::Stderr => finished.stderr.extend(bytes),
                    }
                }
                Message::ExecExited { exit } => {
                    finished.exit = exit;
                    return finished;
                }
                other => finished.other.push(other),
            }
        }
    }

    /// Sends `Shutdown`, expects `Done`, and waits for the agent to exit with 0.
    pub fn shutdown(mut self) {
        assert_eq!(self.request(u64::MAX, Message::Shutdown), Message::Done);
        let mut status = 0;
        // SAFETY: waitpid on our own child into an owned integer.
        let reaped = unsafe { libc::waitpid(self.pid, &mut status, 0) };
        assert_eq!(reaped, self.pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "agent status {status:#x}");
        self.pid = 0;
    }

    /// The agent's resident memory, in KiB.
    pub fn agent_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap_or("VmRSS: 0 kB");
        line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0)
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        if self.pid > 0 {
            // SAFETY: kill and reap our own, unreaped child.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
                libc::waitpid(self.pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

fn run_child(root: &Path, channel: UnixStream) -> bool {
    // Like PID 1 in a sandbox, the agent inherits the orphans of its commands.
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let base_env: BTreeMap<String, String> =
        [("PATH", sandkasten_jail::environment::SANDBOX_PATH), ("HOME", "/workspace"), ("LANG", "C.UTF-8")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
    let Ok(root) = SandboxRoot::open(root, test_identity()) else { return false };
    let context = ServeContext {
        root,
        base_env: &base_env,
        launcher: &ForkExecLauncher,
        home: super::DEFAULT_CWD,
        workdir: super::DEFAULT_CWD,
        disk_bytes: 0,
        host_connections: None,
    };
    serve(channel, &context).is_ok()
}

/// A command's complete output and exit.
#[derive(Debug, Default)]
pub struct Finished {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit: CommandExit,
    pub other: Vec<Message>,
}

impl Finished {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// A `CommandSpec` running `sh -c script`.
pub fn shell(script: &str) -> sandkasten_types::CommandSpec {
    sandkasten_types::CommandSpec { argv: Some(vec!["sh".into(), "-c".into(), script.into()]), ..Default::default() }
}

/// True when `pid` no longer exists (or is a zombie waiting for someone else).
pub fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// Waits up to `within` for `condition`.
pub fn eventually(within: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let give_up = Instant::now() + within;
    while Instant::now() < give_up {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    condition()
}
