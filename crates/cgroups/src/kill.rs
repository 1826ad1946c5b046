//! Shared pieces of `kill_all`: signalling listed pids once each and polling until a condition holds.

use std::collections::BTreeSet;
use std::thread;
use std::time::{Duration, Instant};

use crate::error::CgroupError;
use crate::fsops::POLL;
use crate::sys;

/// How long `kill_all` may take before it gives up with `KillTimeout`.
pub(crate) const KILL_DEADLINE: Duration = Duration::from_secs(2);
/// How long one freeze attempt may take before killing goes ahead without it.
pub(crate) const FREEZE_WAIT: Duration = Duration::from_millis(500);

/// Sends SIGKILL to every pid not yet in `killed` and records it there. Our own pid is never signalled
/// (it then shows up in `KillTimeout`); a process that already exited is fine.
pub(crate) fn kill_new(pids: &[u32], killed: &mut BTreeSet<u32>) -> Result<usize, CgroupError> {
    let own = std::process::id();
    let mut sent = 0;
    for &pid in pids {
        if pid == own || !killed.insert(pid) {
            continue;
        }
        match sys::sigkill(pid) {
            Ok(()) => sent += 1,
            Err(err) if err.raw_os_error() == Some(libc::ESRCH) => {}
            Err(source) => return Err(CgroupError::Kill { pid, source }),
        }
    }
    Ok(sent)
}

/// Signals everything `list` returns, again and again, until a pass finds no pid it has not signalled yet
/// or `deadline` passes (the caller then reports what is left).
pub(crate) fn kill_listed(
    deadline: Instant,
    mut list: impl FnMut() -> Result<Vec<u32>, CgroupError>,
) -> Result<(), CgroupError> {
    let own = std::process::id();
    let mut killed = BTreeSet::new();
    while Instant::now() < deadline {
        let fresh: Vec<u32> = list()?.into_iter().filter(|pid| *pid != own && !killed.contains(pid)).collect();
        if fresh.is_empty() {
            break;
        }
        kill_new(&fresh, &mut killed)?;
    }
    Ok(())
}

/// Polls `done` every few milliseconds until it returns true (→ true) or `deadline` passes (→ false).
pub(crate) fn poll_until(
    deadline: Instant,
    mut done: impl FnMut() -> Result<bool, CgroupError>,
) -> Result<bool, CgroupError> {
    // Killed processes usually vanish within tens of microseconds: start polling fast and back off to POLL, so a
    // teardown does not pay a fixed 10 ms (it capped sustained create+delete below 100/s per spawner).
    let mut pause = Duration::from_micros(50);
    loop {
        if done()? {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        thread::sleep(pause);
        pause = (pause * 2).min(POLL);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn own_pid_is_never_signalled() {
        let mut killed = BTreeSet::new();
        assert_eq!(kill_new(&[std::process::id()], &mut killed).unwrap(), 0);
        assert!(killed.is_empty());
    }

    #[test]
    fn poll_until_times_out_and_succeeds() {
        let soon = Instant::now() + Duration::from_millis(30);
        assert!(!poll_until(soon, || Ok(false)).unwrap());
        let later = Instant::now() + Duration::from_secs(1);
        let mut calls = 0;
        assert!(
            poll_until(later, || {
                calls += 1;
                Ok(calls == 2)
            })
            .unwrap()
        );
    }

    #[test]
    fn a_pid_that_is_gone_is_esrch() {
        // pid_max is at most 2^22, so this pid cannot exist.
        let err = sys::sigkill(1 << 23).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ESRCH));
    }
}
