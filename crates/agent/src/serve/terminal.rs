//! Pseudo-terminals for commands started with `spec.pty`: a pair opened from the sandbox's own devpts (`/dev/ptmx`
//! inside the sandbox: the process tier mounts a `newinstance` devpts there, gVisor has its own), the terminal handed
//! to the command's user, and resizes (`TIOCSWINSZ` on the master, then `SIGWINCH` to the terminal's foreground
//! process group).
//!
//! The command gets the terminal as its stdin, stdout and stderr and makes it its controlling terminal (`setsid`,
//! then `TIOCSCTTY` in the jail). The agent keeps the master: what is written there is the command's input, what is
//! read there is everything the command writes (one stream, reported as stdout). No host terminal is involved: the
//! agent's own descriptors 0..2 are `/dev/null` or its channel.

#![allow(unsafe_code)]

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use rustix::fs::{Gid, Mode, OFlags, Uid};
use rustix::io::Errno;
use rustix::process::{Pid, Signal};
use rustix::termios::Winsize;
use sandkasten_types::{Failure, PtySize};

use super::errors::sys_failure;

/// The sandbox's pseudo-terminal multiplexer (a link to its own devpts's `ptmx`).
const PTMX: &str = "/dev/ptmx";

/// A pseudo-terminal pair: the master the agent keeps, the terminal the command gets.
pub struct Terminal {
    /// The master side (close-on-exec).
    pub master: OwnedFd,
    /// The terminal (`/dev/pts/N` of the sandbox), opened without becoming the agent's controlling terminal.
    pub terminal: OwnedFd,
}

fn winsize(size: PtySize) -> Winsize {
    Winsize { ws_row: size.rows, ws_col: size.cols, ws_xpixel: 0, ws_ypixel: 0 }
}

/// Opens a new pseudo-terminal of `size` whose terminal belongs to `owner` (uid, gid; mode 0620, as `grantpt` leaves
/// it). `None` leaves it the agent's (tests without root).
pub fn open(size: PtySize, owner: Option<(u32, u32)>) -> Result<Terminal, Failure> {
    let master = rustix::fs::open(PTMX, OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| sys_failure("opening", PTMX, e))?;
    let number = unlock(&master)?;
    let name = format!("/dev/pts/{number}");
    let terminal = rustix::fs::open(name.as_str(), OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| sys_failure("opening", &name, e))?;
    if let Some((uid, gid)) = owner {
        rustix::fs::fchown(&terminal, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
            .map_err(|e| sys_failure("handing over", &name, e))?;
    }
    rustix::fs::fchmod(&terminal, Mode::from_raw_mode(0o620))
        .map_err(|e| sys_failure("setting the mode of", &name, e))?;
    resize(&master, size)?;
    Ok(Terminal { master, terminal })
}

/// Unlocks the terminal of `master` (`TIOCSPTLCK` 0) and answers its number (`TIOCGPTN`).
fn unlock(master: &OwnedFd) -> Result<u32, Failure> {
    let locked: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads one int from a valid pointer that outlives the call, on a descriptor we own.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &locked) } != 0 {
        return Err(sys_failure(
            "unlocking",
            "the pseudo-terminal",
            Errno::from_io_error(&last()).unwrap_or(Errno::IO),
        ));
    }
    let mut number: libc::c_uint = 0;
    // SAFETY: TIOCGPTN writes one unsigned int through a valid pointer that outlives the call.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTN, &mut number) } != 0 {
        return Err(sys_failure("naming", "the pseudo-terminal", Errno::from_io_error(&last()).unwrap_or(Errno::IO)));
    }
    Ok(number)
}

fn last() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// Gives the terminal behind `master` a new size.
pub fn resize(master: impl AsFd, size: PtySize) -> Result<(), Failure> {
    rustix::termios::tcsetwinsize(master, winsize(size)).map_err(|e| sys_failure("resizing", "the pseudo-terminal", e))
}

/// Sends `SIGWINCH` to the terminal's foreground process group (else to `leader`'s group). Linux does so itself on a
/// size change; gVisor (runsc 2024-07) changes the size without signalling, so the agent does it on every tier (a
/// second `SIGWINCH` only makes a program read the same size again).
pub fn signal_resized(master: impl AsFd, leader: libc::pid_t) {
    let group = rustix::termios::tcgetpgrp(master).ok().or_else(|| Pid::from_raw(leader));
    if let Some(group) = group {
        let _ = rustix::process::kill_process_group(group, Signal::WINCH);
    }
}
