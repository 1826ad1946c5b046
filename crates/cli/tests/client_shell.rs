//! `sandkasten sandbox shell ID` against a real `sandkasten serve`, driven the way a person uses it: the CLI runs on
//! a pseudo-terminal this test holds the master of (it is the session leader with that terminal as its controlling
//! terminal). What is typed there reaches the sandbox's shell, its output comes back, the sandbox's terminal has the
//! local size, a local resize (TIOCSWINSZ on the master: the CLI gets SIGWINCH) reaches the sandbox's terminal, the
//! exit code is the shell's, and the local terminal is left as it was found (raw mode undone).
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Tier;
use serde_json::json;
use serve::{KEY_1, Server, assert_sandbox_gone_on};

per_tier!(the_shell_types_resizes_and_exits_with_the_commands_code);

/// A pseudo-terminal pair of the test's own (the host's devpts: this is the user's terminal, not a sandbox's).
fn open_pty(cols: u16, rows: u16) -> (OwnedFd, OwnedFd) {
    let (mut master, mut slave) = (0, 0);
    let size = libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: openpty writes two descriptors into the integers and reads the size; no name buffer or termios given.
    let ret = unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), &size) };
    assert_eq!(ret, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just created and belong to nobody else.
    unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) }
}

fn resize(master: &OwnedFd, cols: u16, rows: u16) {
    let size = libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCSWINSZ reads a winsize that outlives the call, on our own descriptor.
    assert_eq!(unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &size) }, 0);
}

/// The terminal settings of the slave side (seen through the master), as bytes to compare.
fn settings(slave: &OwnedFd) -> Vec<u8> {
    // SAFETY: termios is plain data; tcgetattr fills it from our own descriptor.
    let mut termios: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::tcgetattr(slave.as_raw_fd(), &mut termios) }, 0);
    format!("{} {} {} {}", termios.c_iflag, termios.c_oflag, termios.c_cflag, termios.c_lflag).into_bytes()
}

/// Reads the master into `seen` until `needle` has appeared after byte `from` of it.
fn read_until(master: &mut File, seen: &mut String, from: usize, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut buffer = [0u8; 4096];
    while !seen[from..].contains(needle) {
        assert!(Instant::now() < deadline, "{needle:?} never appeared on the terminal: {seen:?}");
        let mut fds = [libc::pollfd { fd: master.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        // SAFETY: poll on one valid pollfd for at most 100 ms.
        if unsafe { libc::poll(fds.as_mut_ptr(), 1, 100) } <= 0 {
            continue;
        }
        match master.read(&mut buffer) {
            Ok(0) | Err(_) => std::thread::sleep(Duration::from_millis(20)),
            Ok(n) => seen.push_str(&String::from_utf8_lossy(&buffer[..n])),
        }
    }
}

fn the_shell_types_resizes_and_exits_with_the_commands_code(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({}));
    let (master, slave) = open_pty(97, 31);
    let before = settings(&slave);
    let mut command = Command::new(common::bin());
    command
        .args(["sandbox", "shell", "--server", &server.url, &id])
        .env("SANDKASTEN_API_KEY", KEY_1)
        .env("TERM", "xterm")
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave.try_clone().unwrap()));
    // SAFETY: setsid and ioctl are async-signal-safe; the child makes its stdin (the slave) its controlling terminal,
    // as a login on a terminal would.
    unsafe {
        command.pre_exec(move || {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().unwrap();
    let mut terminal = File::from(master.try_clone().unwrap());
    let mut seen = String::new();
    terminal.write_all(b"echo typed-$((40 + 2)) $TERM; stty size\n").unwrap();
    read_until(&mut terminal, &mut seen, 0, "typed-42 xterm");
    read_until(&mut terminal, &mut seen, 0, "31 97\r\n");

    resize(&master, 123, 45);
    // The CLI forwards the new size at SIGWINCH; the shell sees it once the resize request has been answered.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mark = seen.len();
        terminal.write_all(b"stty size; echo size-$((6 * 7))-checked\n").unwrap();
        read_until(&mut terminal, &mut seen, mark, "size-42-checked\r\n");
        if seen[mark..].contains("45 123\r\n") {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
        assert!(Instant::now() < deadline, "the resize never reached the sandbox's terminal: {seen:?}");
    }
    terminal.write_all(b"exit 7\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        // Keep the master drained so the CLI never blocks writing to its terminal.
        let mut buffer = [0u8; 4096];
        let mut fds = [libc::pollfd { fd: terminal.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        // SAFETY: poll on one valid pollfd for at most 50 ms.
        if unsafe { libc::poll(fds.as_mut_ptr(), 1, 50) } > 0 {
            let _ = terminal.read(&mut buffer);
        }
        assert!(Instant::now() < deadline, "the CLI did not exit after the shell did: {seen:?}");
    };
    assert_eq!(status.code(), Some(7), "{seen:?}");
    assert_eq!(settings(&slave), before, "the CLI left the terminal in raw mode");
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    assert_sandbox_gone_on(tier, &id);
}
