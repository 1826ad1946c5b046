//! Per-user kernel quotas: the kernel charges what a user namespace's processes hold (inotify instances, pending
//! signals, pipe buffers, …) to the namespace's owner and to their host uid. A sandbox must not be able to use up
//! host root's share, nor its neighbours' (each sandbox has a host id range of its own).
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]
// A failed assertion ends the test process, which reaps the CLI child with it.
#![allow(clippy::zombie_processes)]

#[macro_use]
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::{Tier, bin};

per_tier!(inotify_exhaustion_inside_does_not_starve_host_root, pipes_in_one_sandbox_do_not_shrink_anothers,);

/// Runs Python `code` in a sandbox of `tier` (at most `timeout`) that takes a resource and holds it: returns the run
/// and the first line the code printed (after which it holds what it took while the caller checks).
fn hold_in_sandbox(tier: Tier, timeout: &str, code: &str) -> (std::process::Child, String) {
    let mut child = Command::new(bin())
        .args(["run", "--isolation", tier.name(), "--timeout", timeout, "--lang", "python", "--code", code])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn sandkasten run");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("read");
    (child, line)
}

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
    let (mut child, line) = hold_in_sandbox(tier, "20s", &code);
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

/// Pipe buffers are a per-user quota (`fs.pipe-user-pages-soft`, 64 MiB): with one host uid for every sandbox, one
/// sandbox holding pipes resized to 1 MiB left every other sandbox with one-page pipes (`F_SETPIPE_SZ` → EPERM). Each
/// sandbox has a host id range of its own, so a neighbour's pipes do not count against it.
fn pipes_in_one_sandbox_do_not_shrink_anothers(tier: Tier) {
    let _lock = common::shared_lock();
    let hog = [
        "import errno, fcntl, os, time",
        "pipes = []",
        "while len(pipes) < 512:",
        "    r, w = os.pipe()",
        "    try:",
        "        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)",
        "    except OSError as e:",
        "        print('full', len(pipes), errno.errorcode[e.errno], flush=True)",
        "        break",
        "    pipes.append((r, w))",
        "else:",
        "    print('never full', len(pipes), flush=True)",
        "time.sleep(20)",
    ]
    .join("\n");
    let (mut child, line) = hold_in_sandbox(tier, "30s", &hog);
    if tier == Tier::Process {
        // The hog reached its own user's quota: from here on, a sandbox sharing its uid would get one-page pipes.
        assert!(line.starts_with("full ") && line.contains("EPERM"), "the hog did not fill its pipe quota: {line:?}");
    }
    let neighbour = "import fcntl, os\nr, w = os.pipe()\nbefore = fcntl.fcntl(w, fcntl.F_GETPIPE_SZ)\n\
                     print(before, fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20))";
    let r = common::run_on(tier, ["--lang", "python", "--code", neighbour]).json();
    let _ = child.kill();
    let _ = child.wait();
    r.assert_exit(0);
    assert_eq!(r.stdout(), "65536 1048576\n", "the neighbour's pipes were shrunk by the hog's\n{}", r.describe());
}
