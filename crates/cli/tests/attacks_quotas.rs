//! Per-user kernel quotas: the kernel charges what a user namespace's processes hold (inotify instances, pending
//! signals, …) to the namespace's owner as well. A sandbox must not be able to use up host root's share.
//!
//! Every test runs on each isolation tier (`process::NAME` and `gvisor::NAME`, see `per_tier!`).

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]
// A failed assertion ends the test process, which reaps the CLI child with it.
#![allow(clippy::zombie_processes)]

#[macro_use]
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::{Tier, bin};

per_tier!(inotify_exhaustion_inside_does_not_starve_host_root,);

fn inotify_exhaustion_inside_does_not_starve_host_root(tier: Tier) {
    let _lock = common::shared_lock();
    let code = [
        "import ctypes, sys, time",
        "libc = ctypes.CDLL(None, use_errno=True)",
        "fds = []",
        "while True:",
        "    fd = libc.inotify_init1(0)",
        "    if fd < 0:",
        "        break",
        "    fds.append(fd)",
        "print('full', len(fds), ctypes.get_errno(), flush=True)",
        "time.sleep(3)",
    ]
    .join("\n");
    let mut child = Command::new(bin())
        .args(["run", "--isolation", tier.name(), "--timeout", "20s", "--lang", "python", "--code", &code])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn sandkasten run");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("read");
    assert!(line.starts_with("full "), "the sandbox did not reach its inotify limit: {line:?}");
    let opened: usize = line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(opened > 0, "the sandbox opened no inotify instance at all: {line:?}");
    // While the sandbox holds every instance it could get, host root must still get one.
    // SAFETY: inotify_init1 takes a flag word; the returned descriptor is closed right after.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    let errno = std::io::Error::last_os_error();
    if fd >= 0 {
        // SAFETY: closing the descriptor we just opened.
        unsafe { libc::close(fd) };
    }
    let status = child.wait().expect("wait");
    assert!(fd >= 0, "host root could not open an inotify instance while a sandbox held {opened}: {errno}");
    assert!(status.success(), "the sandbox run failed: {status}");
}
