//! The host's wait for one execution: a single-threaded poll over the program's stdout and stderr pipes, the agent's
//! protocol channel and a signalfd, until everything is closed, the deadline passes, an output cap is exceeded or the
//! owner is told to stop.

#![allow(unsafe_code)]

use std::io::{self, Read};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use sandkasten_protocol::{FrameDecoder, Message, monotonic_ns};

use super::stdin_pump::StdinPump;
use crate::error::RuntimeError;
use crate::output::{Capture, OutputSink};
use sandkasten_types::StreamKind;

/// Signals that make the owner destroy the sandbox and stop.
pub(crate) const STOP_SIGNALS: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Blocks the stop signals and returns a signalfd that reports them, plus the previous signal mask to restore.
pub(crate) fn block_stop_signals() -> Result<(OwnedFd, libc::sigset_t), RuntimeError> {
    // SAFETY: sigset_t is plain data initialised by sigemptyset; pthread_sigmask and signalfd read valid sets and
    // write the old mask into an owned value. The returned descriptor is owned by the OwnedFd.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut previous: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in STOP_SIGNALS {
            libc::sigaddset(&mut set, signal);
        }
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut previous) != 0 {
            return Err(RuntimeError::sys("pthread_sigmask", io::Error::last_os_error()));
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if fd < 0 {
            libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
            return Err(RuntimeError::sys("signalfd", io::Error::last_os_error()));
        }
        Ok((OwnedFd::from_raw_fd(fd), previous))
    }
}

/// Restores the signal mask saved by `block_stop_signals`.
pub(crate) fn restore_signal_mask(previous: &libc::sigset_t) {
    // SAFETY: `previous` is a valid set returned by pthread_sigmask.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, previous, std::ptr::null_mut()) };
}

/// Why the wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitEnd {
    /// Every stream and the channel closed: the agent has exited.
    Finished,
    /// The deadline passed.
    TimedOut,
    /// A stream went past the output limit.
    OutputLimit,
    /// A stop signal arrived.
    Interrupted(i32),
}

/// What the host saw during the execution.
#[derive(Debug)]
pub(crate) struct Observed {
    pub(crate) stdout: Capture,
    pub(crate) stderr: Capture,
    pub(crate) messages: Vec<Message>,
    pub(crate) first_output_ns: Option<u64>,
    pub(crate) protocol_error: Option<String>,
}

/// The descriptors to watch.
pub(crate) struct Watched {
    pub(crate) stdout: OwnedFd,
    pub(crate) stderr: OwnedFd,
    pub(crate) channel: OwnedFd,
    pub(crate) signals: OwnedFd,
    /// The copy of the owner's stdin into the program's, if any.
    pub(crate) stdin: Option<StdinPump>,
}

const CHUNK: usize = 64 << 10;

/// Waits until the execution ends one way or another; output goes to `sink` as it arrives.
pub(crate) fn wait(
    watched: Watched,
    output_limit: u64,
    deadline_ns: u64,
    sink: &mut dyn OutputSink,
) -> Result<(WaitEnd, Observed), RuntimeError> {
    let mut observed = Observed {
        stdout: Capture::new(output_limit),
        stderr: Capture::new(output_limit),
        messages: Vec::new(),
        first_output_ns: None,
        protocol_error: None,
    };
    let mut decoder = FrameDecoder::new();
    let mut stdout = Some(std::fs::File::from(watched.stdout));
    let mut stderr = Some(std::fs::File::from(watched.stderr));
    let mut channel = Some(std::fs::File::from(watched.channel));
    let mut buffer = vec![0u8; CHUNK];
    let mut stdin = watched.stdin;

    while stdout.is_some() || stderr.is_some() || channel.is_some() {
        let now = monotonic_ns();
        if now >= deadline_ns {
            return Ok((WaitEnd::TimedOut, observed));
        }
        let remaining = deadline_ns - now;
        let timeout =
            Timespec { tv_sec: (remaining / 1_000_000_000) as i64, tv_nsec: (remaining % 1_000_000_000) as i64 };
        let interest = PollFlags::IN | PollFlags::HUP;
        let mut fds = Vec::with_capacity(4);
        fds.push(PollFd::new(&watched.signals, PollFlags::IN));
        for file in [&stdout, &stderr, &channel].into_iter().flatten() {
            fds.push(PollFd::new(file, interest));
        }
        let pump_at = fds.len();
        if let Some((fd, flags)) = stdin.as_ref().and_then(StdinPump::interest) {
            fds.push(PollFd::from_borrowed_fd(fd, flags));
        }
        match poll(&mut fds, Some(&timeout)) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(RuntimeError::sys("poll", e)),
        }
        let ready: Vec<bool> = fds.iter().map(|fd| !fd.revents().is_empty()).collect();
        drop(fds);
        if ready.get(pump_at).copied().unwrap_or(false)
            && let Some(pump) = stdin.as_mut()
        {
            pump.on_ready();
        }
        let mut index = 0;
        if ready[index] {
            return Ok((WaitEnd::Interrupted(read_signal(&watched.signals)), observed));
        }
        index += 1;
        for kind in [Some(StreamKind::Stdout), Some(StreamKind::Stderr), None] {
            let slot = match kind {
                Some(StreamKind::Stdout) => &mut stdout,
                Some(StreamKind::Stderr) => &mut stderr,
                None => &mut channel,
            };
            let Some(file) = slot.as_mut() else { continue };
            let is_ready = ready.get(index).copied().unwrap_or(false);
            index += 1;
            if !is_ready {
                continue;
            }
            let n = match file.read(&mut buffer) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted || e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(_) => 0,
            };
            if n == 0 {
                *slot = None;
                continue;
            }
            let bytes = &buffer[..n];
            match kind {
                Some(stream) => {
                    observed.first_output_ns.get_or_insert_with(monotonic_ns);
                    let capture =
                        if stream == StreamKind::Stdout { &mut observed.stdout } else { &mut observed.stderr };
                    let (kept, exceeded) = capture.append(bytes);
                    sink.chunk(stream, kept);
                    if exceeded {
                        return Ok((WaitEnd::OutputLimit, observed));
                    }
                }
                None => {
                    decoder.push(bytes);
                    loop {
                        match decoder.next_envelope() {
                            Ok(Some(envelope)) => observed.messages.push(envelope.msg),
                            Ok(None) => break,
                            Err(e) => {
                                observed.protocol_error = Some(e.to_string());
                                channel = None;
                                break;
                            }
                        }
                    }
                }
            }
        }
    }
    Ok((WaitEnd::Finished, observed))
}

fn read_signal(signals: &OwnedFd) -> i32 {
    let mut info = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
    match rustix::io::read(signals.as_fd(), &mut info) {
        Ok(n) if n == info.len() => i32::from_ne_bytes([info[0], info[1], info[2], info[3]]),
        _ => libc::SIGTERM,
    }
}
