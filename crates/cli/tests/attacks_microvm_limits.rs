//! The microvm tier's limits, attacked from inside the guest and asserted on the host: a memory bomb (2 GiB asked
//! under a 256 MiB limit) dies inside the guest while the VMM, its cgroup (sized for the guest's RAM plus the VMM's
//! overhead) and every host process live on; the wall timeout kills the VM (no VMM of it remains); a fork bomb is
//! held by the guest's process limit, the sandbox's host cgroup stays at the VMM's few tasks and the host's
//! process count does not grow; filling the disk stops at the disk limit, and its image on the host does not grow
//! past its size. Nothing of any sandbox is left afterwards.
//!
//! The microvm tier is not in `Tier::AVAILABLE` yet: plain tests, each skipping when QEMU or the boot files are
//! missing. Each test boots one VM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::microvm::{VMM_OVERHEAD_BYTES, Watched, alive, assert_no_microvm_leaks, children_of, wait_for_vmm};
use common::{HostVictim, host_pids};

/// How long a boot may take on a loaded host before the test gives up.
const BOOT_LIMIT: Duration = Duration::from_secs(120);
/// The host tasks a microVM sandbox's cgroup allows (`VMM_HOST_TASKS`): QEMU's threads, never the guest's processes.
const VMM_HOST_TASKS: u64 = 64;

/// A number from sandbox `id`'s cgroup: `v1` under `/sys/fs/cgroup/<controller>/sandkasten/ID`, else `v2` under
/// the unified hierarchy. `None` when neither can be read (the cgroup is gone) or the value is not a number.
fn cgroup_number(id: &str, controller: &str, v1: &str, v2: &str) -> Option<u64> {
    let read = |path: String| std::fs::read_to_string(path).ok()?.trim().parse::<u64>().ok();
    read(format!("/sys/fs/cgroup/{controller}/sandkasten/{id}/{v1}"))
        .or_else(|| read(format!("/sys/fs/cgroup/sandkasten/{id}/{v2}")))
}

/// Samples `sample` every 100 ms while `run`'s CLI runs (up to `limit`); the largest value seen.
fn largest_while_running(run: &mut Watched, limit: Duration, mut sample: impl FnMut() -> Option<u64>) -> Option<u64> {
    let deadline = Instant::now() + limit;
    let mut largest = None;
    while run.running() && Instant::now() < deadline {
        if let Some(value) = sample() {
            largest = largest.max(Some(value));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    largest
}

#[test]
fn memory_bomb_dies_inside_the_guest_and_nothing_on_the_host() {
    require_microvm!();
    let mut victim = HostVictim::sleep();
    let memory: u64 = 256 << 20;
    // 128 chunks of 16 MiB, each written: 2 GiB asked of a 256 MiB guest. Each chunk is counted as it lands.
    let code = "chunks = []\nfor i in range(128):\n    chunks.append(b'x' * (16 << 20))\n    print(i, flush=True)\n";
    let mut run = Watched::start(&["--memory", "256MiB", "--timeout", "120s", "--", "/usr/bin/python3", "-c", code]);
    let id = run.sandbox_id(Duration::from_secs(30));
    let vmm = wait_for_vmm(&id, BOOT_LIMIT);
    let mut limit = None;
    let peak = largest_while_running(&mut run, Duration::from_secs(200), || {
        limit = limit.or_else(|| cgroup_number(&id, "memory", "memory.limit_in_bytes", "memory.max"));
        cgroup_number(&id, "memory", "memory.max_usage_in_bytes", "memory.peak")
            .or_else(|| cgroup_number(&id, "memory", "memory.usage_in_bytes", "memory.current"))
    });
    let r = run.finish(Duration::from_secs(30));

    let chunks = r.stdout().lines().count();
    assert!(chunks < 128, "the guest allocated its 2 GiB under a 256 MiB limit\n{}", r.describe());
    // Killed inside the guest (by its kernel's OOM killer), reported by the guest's agent: the VM lived on.
    assert_eq!(r.signal(), Some(9), "the memory bomb was not killed\n{}", r.describe());
    assert_eq!(r.error_code(), None, "the VM died instead of the program in it\n{}", r.describe());
    // The host's cgroup counts no OOM kill when the guest's kernel kills: the guest's agent reads its kernel's counter.
    assert!(r.flag("oom_killed"), "the guest's OOM kill is not reported\n{}", r.describe());
    assert_eq!(r.limit().as_deref(), Some("memory"), "the memory bomb is reported as another limit\n{}", r.describe());
    let limit = limit.expect("the sandbox's memory cgroup was never read while it ran");
    assert!(
        limit <= memory + VMM_OVERHEAD_BYTES,
        "the VMM's cgroup allows {limit} bytes, more than the guest's {memory} plus the VMM's overhead"
    );
    let peak = peak.expect("the sandbox's memory usage was never read while it ran");
    assert!(peak <= limit, "the sandbox's cgroup used {peak} bytes over its limit of {limit}");
    assert!(victim.alive(), "a host process died during the memory bomb");
    assert!(!alive(vmm), "the VMM {vmm} outlived its run");
    assert_no_microvm_leaks(&id);
}

#[test]
fn wall_timeout_kills_the_vm() {
    require_microvm!();
    let run = Watched::start(&["--timeout", "3s", "--", "sleep", "100"]);
    let id = run.sandbox_id(Duration::from_secs(30));
    let vmm = wait_for_vmm(&id, Duration::from_secs(30));
    let started = Instant::now();
    let r = run.finish(Duration::from_secs(90));
    assert!(r.flag("timed_out"), "sleep 100 under a 3 s timeout did not time out\n{}", r.describe());
    assert_eq!(r.limit().as_deref(), Some("time"), "{}", r.describe());
    assert_eq!(r.exit_code(), None, "{}", r.describe());
    // The timeout counts the run's own time, not the boot (~3 s under software emulation, more on a loaded host):
    // the run ends long before sleep 100 could.
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the timed-out run took {:?}\n{}",
        started.elapsed(),
        r.describe()
    );
    assert!(!alive(vmm), "the VMM {vmm} of a timed-out run still runs");
    assert_no_microvm_leaks(&id);
}

#[test]
fn fork_bomb_is_held_by_the_guests_process_limit() {
    require_microvm!();
    // Every child forks forever (and so does each of its children); the first process counts its own children
    // until the guest refuses one, then proves the guest still answers.
    let code = "import os, time\n\
                n = 0\n\
                err = None\n\
                while True:\n\
                \x20   try:\n\
                \x20       pid = os.fork()\n\
                \x20   except OSError as e:\n\
                \x20       err = e.errno\n\
                \x20       break\n\
                \x20   if pid == 0:\n\
                \x20       os.close(1)\n\
                \x20       os.close(2)\n\
                \x20       while True:\n\
                \x20           try:\n\
                \x20               os.fork()\n\
                \x20           except OSError:\n\
                \x20               time.sleep(0.2)\n\
                \x20   n += 1\n\
                print('forked', n, 'errno', err, flush=True)\n\
                time.sleep(3)\n\
                print('still answering', flush=True)\n";
    // Exclusive: no other test's sandbox starts or ends while the host's processes are counted.
    let lock = common::exclusive_lock();
    let host_before = host_pids().len();
    let args = ["--pids", "64", "--timeout", "150s", "--", "/usr/bin/python3", "-c", code];
    let mut run = Watched::start_locked(&args, lock);
    let id = run.sandbox_id(Duration::from_secs(30));
    let vmm = wait_for_vmm(&id, BOOT_LIMIT);
    let mut vmm_children = Vec::new();
    let mut host_during = 0;
    let host_tasks = largest_while_running(&mut run, Duration::from_secs(200), || {
        vmm_children.extend(children_of(vmm));
        host_during = host_during.max(host_pids().len());
        cgroup_number(&id, "pids", "pids.current", "pids.current")
    });
    let r = run.finish(Duration::from_secs(30));
    let stdout = r.stdout();
    let forked: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("forked ")?.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("the bomb did not report\n{}", r.describe()));
    assert!(forked < 64, "the guest let one process fork {forked} children under --pids 64\n{}", r.describe());
    assert!(
        stdout.contains(&format!("errno {}", libc::EAGAIN)),
        "the fork was not refused with EAGAIN\n{}",
        r.describe()
    );
    assert!(stdout.contains("still answering"), "the guest stopped answering under the bomb\n{}", r.describe());
    // TODO(#13): nothing counts the guest's refused forks yet, so the result cannot name the limit (as on gVisor);
    // it must not name another one. Assert `r.limit() == Some("pids")` once the guest's agent reports it.
    assert!(r.limit().is_none_or(|l| l == "pids"), "the fork bomb is reported as another limit\n{}", r.describe());
    let host_tasks = host_tasks.expect("the sandbox's pids cgroup was never read while it ran");
    assert!(
        host_tasks <= VMM_HOST_TASKS,
        "the guest's fork bomb reached the host: {host_tasks} tasks in the sandbox's host cgroup"
    );
    assert!(vmm_children.is_empty(), "the VMM started host processes during the bomb: {vmm_children:?}");
    assert!(!alive(vmm), "the VMM {vmm} outlived its run");
    assert_no_microvm_leaks(&id);
    // The guest's processes are no host processes, during the bomb or after it (builds of other engineers may
    // start a few processes meanwhile; the bomb's 60 and more would show above this margin while it runs).
    let host_after = host_pids().len();
    for (when, count) in [("during", host_during), ("after", host_after)] {
        assert!(count <= host_before + 48, "the host has {count} processes {when} the bomb, {host_before} before");
    }
}

#[test]
fn disk_fill_stops_at_the_sandboxs_disk_image() {
    require_microvm!();
    let disk: u64 = 32 << 20;
    // 256 MiB asked of a 32 MiB disk, synced, its size reported; then a pause in which the host looks at the image.
    let code = "dd if=/dev/zero of=/workspace/fill bs=1M count=256 2>/dev/null; sync; \
                echo written $(stat -c %s /workspace/fill); sleep 2";
    let mut run = Watched::start(&["--disk", "32MiB", "--timeout", "120s", "--", "/bin/sh", "-c", code]);
    let id = run.sandbox_id(Duration::from_secs(30));
    let image = common::microvm::state_dir_of(&id).join("disk.ext4");
    let largest = largest_while_running(&mut run, Duration::from_secs(200), || {
        let meta = std::fs::metadata(&image).ok()?;
        use std::os::unix::fs::MetadataExt;
        Some(meta.len().max(meta.blocks() * 512))
    });
    let r = run.finish(Duration::from_secs(30));
    let written: u64 = r
        .stdout()
        .lines()
        .find_map(|l| l.strip_prefix("written ")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("the filler did not report\n{}", r.describe()));
    assert!(written > disk / 2, "positive control: the guest could write to its disk\n{}", r.describe());
    assert!(written <= disk, "the guest wrote {written} bytes to a {disk}-byte disk\n{}", r.describe());
    // The image is the disk limit plus ext4's metadata (1/32 and 2 MiB): the guest cannot grow it on the host.
    let largest = largest.expect("the sandbox's disk image was never seen while it ran");
    let image_bytes = disk + disk / 32 + (2 << 20);
    assert!(largest <= image_bytes, "the disk image took {largest} bytes on the host, past its {image_bytes}");
    assert_no_microvm_leaks(&id);
}
