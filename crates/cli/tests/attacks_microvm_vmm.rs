//! The microvm tier's VMM (QEMU) as the host sees it while a guest runs: not host root (its real and effective ids
//! in the sandboxes' id range), no capabilities, no_new_privs and seccomp on, PID 1 of a pid namespace of its own,
//! its own network, mount and user namespaces, in the sandbox's cgroup under `sandkasten`, and a root that holds
//! none of the host's sandbox state. And `kill -9` of the VMM from the host while a command runs ends the run
//! promptly with an error, leaving no VMM, cgroup, record or `<state_dir>/microvm/ID` behind.
//!
//! The guest proves its command runs by writing a marker through to its disk image (`Watched::wait_for_marker`).
//! The microvm tier is not in `Tier::AVAILABLE` yet: plain tests, each skipping when QEMU or the boot files are
//! missing. Each test boots one VM.

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::microvm::{Watched, alive, assert_no_microvm_leaks, status_field, wait_for_vmm};
use common::{SANDBOX_UID_BASE, SANDBOX_UID_END, unique_token};

/// How long a boot may take on a loaded host before the test gives up.
const BOOT_LIMIT: Duration = Duration::from_secs(120);

/// A guest command that writes `marker` to its disk, syncs it, then sleeps `seconds`.
fn marked_sleep(marker: &str, seconds: u32) -> String {
    format!("echo {marker} > /workspace/marker && sync && sleep {seconds}")
}

fn namespace(pid: &str, kind: &str) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).unwrap().to_string_lossy().into_owned()
}

#[test]
fn vmm_is_an_unprivileged_jailed_process_in_the_sandboxs_cgroup() {
    require_microvm!();
    let marker = unique_token("VMMARK");
    let run = Watched::start(&["--timeout", "90s", "--", "/bin/sh", "-c", &marked_sleep(&marker, 8)]);
    let id = run.sandbox_id(Duration::from_secs(30));
    let vmm = wait_for_vmm(&id, BOOT_LIMIT);
    run.wait_for_marker(&id, &marker, BOOT_LIMIT);
    assert!(alive(vmm), "the VMM {vmm} died while its guest runs");

    let range = SANDBOX_UID_BASE..SANDBOX_UID_END;
    for field in ["Uid", "Gid"] {
        let ids: Vec<u32> = status_field(vmm, field).iter().map(|id| id.parse().unwrap()).collect();
        assert_eq!(ids.len(), 4, "{field} of {vmm}: {ids:?}");
        for (which, id) in ["real", "effective", "saved", "filesystem"].iter().zip(&ids) {
            assert!(range.contains(id), "the VMM's {which} {field} {id} is not a sandbox id ({range:?})");
        }
    }
    for caps in ["CapEff", "CapPrm", "CapAmb"] {
        assert_eq!(status_field(vmm, caps), ["0000000000000000"], "the VMM has capabilities ({caps})");
    }
    assert_eq!(status_field(vmm, "NoNewPrivs"), ["1"], "the VMM may gain privileges (no_new_privs is off)");
    assert_eq!(status_field(vmm, "Seccomp"), ["2"], "the VMM runs without a seccomp filter");
    let nspid = status_field(vmm, "NSpid");
    assert_eq!(nspid.len(), 2, "the VMM is not in a pid namespace of its own: NSpid {nspid:?}");
    assert_eq!(nspid[1], "1", "the VMM is not PID 1 of its jail: NSpid {nspid:?}");

    let cgroups = std::fs::read_to_string(format!("/proc/{vmm}/cgroup")).unwrap();
    for controller in ["memory", "pids", "cpu"] {
        let line = cgroups.lines().find(|l| l.split(':').nth(1).is_some_and(|c| c.split(',').any(|c| c == controller)));
        assert_eq!(
            line.and_then(|l| l.rsplit(':').next()),
            Some(format!("/sandkasten/{id}").as_str()),
            "the VMM is not in the sandbox's {controller} cgroup:\n{cgroups}"
        );
    }
    let vmm_pid = vmm.to_string();
    for kind in ["net", "mnt", "user", "pid", "ipc", "uts"] {
        assert_ne!(namespace(&vmm_pid, kind), namespace("self", kind), "the VMM shares the host's {kind} namespace");
    }
    // Its root is the jail's: none of the host's sandbox state (no path to any sandbox's disk), no home of root.
    // (The boot directory is there, read-only: QEMU's loader opens the kernel and initramfs by path.)
    let root = format!("/proc/{vmm}/root");
    assert!(Path::new(&root).join("usr").is_dir(), "positive control: the VMM's root has /usr");
    for hidden in ["run/sandkasten", "root", "home"] {
        let path = Path::new(&root).join(hidden);
        let listing = std::fs::read_dir(&path).map(|entries| entries.count());
        assert!(!matches!(listing, Ok(n) if n > 0), "the VMM's root shows the host's /{hidden} ({listing:?} entries)");
    }
    let host_record = format!("run/sandkasten/sandboxes/{id}.json");
    assert!(Path::new("/").join(&host_record).is_file(), "positive control: the host has the sandbox's record");
    assert!(!Path::new(&root).join(&host_record).exists(), "the VMM's root shows the host's /{host_record}");

    let r = run.finish(Duration::from_secs(60));
    r.assert_exit(0);
    assert!(!alive(vmm), "the VMM {vmm} outlived its run");
    assert_no_microvm_leaks(&id);
}

#[test]
fn kill_9_of_the_vmm_ends_the_run_promptly_and_leaves_nothing() {
    require_microvm!();
    let marker = unique_token("VMMARK");
    let run = Watched::start(&["--timeout", "200s", "--", "/bin/sh", "-c", &marked_sleep(&marker, 180)]);
    let id = run.sandbox_id(Duration::from_secs(30));
    let vmm = wait_for_vmm(&id, BOOT_LIMIT);
    run.wait_for_marker(&id, &marker, BOOT_LIMIT);

    let killed_at = Instant::now();
    // SAFETY: kill(2) of the VMM process just found in the sandbox's cgroup; no memory is involved.
    assert_eq!(unsafe { libc::kill(vmm as libc::pid_t, libc::SIGKILL) }, 0, "kill -9 {vmm}");
    let r = run.finish(Duration::from_secs(60));
    let took = killed_at.elapsed();
    assert!(took < Duration::from_secs(15), "the run went on {took:?} after its VMM was killed\n{}", r.describe());
    assert_eq!(r.exit_code(), None, "a killed VM reported an exit code\n{}", r.describe());
    assert!(!r.flag("timed_out"), "a killed VM was reported as timed out\n{}", r.describe());
    assert!(
        r.error_code().is_some() || r.signal().is_some(),
        "the run of a killed VM reports neither an error nor a signal\n{}",
        r.describe()
    );
    assert_ne!(r.cli_code(), 0, "the CLI said success for a killed VM\n{}", r.describe());
    assert_eq!(r.id(), id);
    assert!(!alive(vmm), "the killed VMM {vmm} is still there");
    assert_no_microvm_leaks(&id);
}
