//! What a microVM guest can reach of its host, attacked from inside and asserted on the host: the guest runs a
//! kernel of its own (not the host's), has no network device (only `lo`) and reaches no host listener (on the
//! host's loopback or its outward address; the listener sees no connection), and sees no host file (canaries the
//! test writes in the host's /tmp and /root just before the run, the host's `/var/lib/sandkasten`), and its program
//! (the sandbox user) opens neither the agent's port, the raw disks nor the guest's memory. After every
//! run nothing of the sandbox is left (record, cgroups, VMM process, its directory under the state dir).
//!
//! The microvm tier is not in `Tier::AVAILABLE` yet: plain tests, each skipping when QEMU or the boot files are
//! missing. Each test boots one VM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use std::net::{IpAddr, TcpListener, UdpSocket};
use std::time::Duration;

use common::microvm::{assert_no_microvm_leaks, vm_run};
use common::{Canary, accepted_within, unique_token};

#[test]
fn guest_runs_a_kernel_of_its_own() {
    require_microvm!();
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let host_version = std::fs::read_to_string("/proc/version").unwrap();
    let r = vm_run(["--timeout", "60s", "--", "/bin/sh", "-c", "uname -r; echo ---; cat /proc/version"]).json();
    r.assert_exit(0);
    let stdout = r.stdout();
    let (release, version) = stdout.split_once("---\n").unwrap_or_else(|| panic!("no separator\n{}", r.describe()));
    assert!(!release.trim().is_empty() && !version.trim().is_empty(), "the guest said nothing\n{}", r.describe());
    assert_ne!(release.trim(), host_release.trim(), "the guest runs the host's kernel release\n{}", r.describe());
    assert_ne!(version.trim(), host_version.trim(), "the guest's /proc/version is the host's\n{}", r.describe());
    assert_no_microvm_leaks(&r.id());
}

/// The host's outward (non-loopback) IPv4 address, if it has a route out: a UDP socket's address once connected
/// (no packet is sent).
fn outward_address() -> Option<IpAddr> {
    let socket = UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.1:9").or_else(|_| socket.connect("10.255.255.1:9")).ok()?;
    let address = socket.local_addr().ok()?.ip();
    (!address.is_loopback() && !address.is_unspecified()).then_some(address)
}

#[test]
fn guest_has_no_network_device_and_reaches_no_host_listener() {
    require_microvm!();
    let listener = TcpListener::bind("0.0.0.0:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut targets = vec!["127.0.0.1".to_owned()];
    match outward_address() {
        Some(address) => targets.push(address.to_string()),
        None => eprintln!("note: this host has no outward IPv4 address; only its loopback listener is tried"),
    }
    // Positive control: the listener takes connections from the host on every address tried.
    for target in &targets {
        std::net::TcpStream::connect((target.as_str(), port)).unwrap_or_else(|e| panic!("host connect {target}: {e}"));
    }
    assert_eq!(accepted_within(&listener, Duration::from_millis(500)), targets.len(), "positive control");

    let code = format!(
        "import os, socket\n\
         print('devices', ','.join(sorted(os.listdir('/sys/class/net'))), flush=True)\n\
         for host in {targets:?}:\n\
         \x20   s = socket.socket()\n\
         \x20   s.settimeout(5)\n\
         \x20   try:\n\
         \x20       s.connect((host, {port}))\n\
         \x20       print(host, 'CONNECTED', flush=True)\n\
         \x20   except OSError as e:\n\
         \x20       print(host, 'failed', e.errno, flush=True)\n"
    );
    let r = vm_run(["--timeout", "60s", "--", "/usr/bin/python3", "-c", &code]).json();
    r.assert_exit(0);
    let stdout = r.stdout();
    assert!(stdout.lines().any(|l| l == "devices lo"), "the guest has network devices besides lo\n{}", r.describe());
    for target in &targets {
        assert!(
            stdout.lines().any(|l| l.starts_with(&format!("{target} failed"))),
            "the guest's connect to {target}:{port} did not fail\n{}",
            r.describe()
        );
    }
    assert!(!stdout.contains("CONNECTED"), "the guest reached a host listener\n{}", r.describe());
    assert_eq!(
        accepted_within(&listener, Duration::from_secs(1)),
        0,
        "the host listener saw a connection from the guest"
    );
    assert_no_microvm_leaks(&r.id());
}

#[test]
fn host_files_are_not_visible_in_the_guest() {
    require_microvm!();
    let in_tmp = Canary::create(format!("/tmp/{}", unique_token("vm-canary-")));
    let in_root = Canary::create(format!("/root/{}", unique_token("vm-canary-")));
    assert!(std::path::Path::new("/var/lib/sandkasten/microvm").is_dir(), "positive control: the host has it");
    let probes = [
        in_tmp.path.display().to_string(),
        in_root.path.display().to_string(),
        "/var/lib/sandkasten".to_owned(),
        "/var/lib/sandkasten/microvm/rootfs.ext4".to_owned(),
        "/run/sandkasten".to_owned(),
        // Positive control: the guest reads its own files.
        "/etc/os-release".to_owned(),
    ];
    let code = format!(
        "import os\n\
         for path in {probes:?}:\n\
         \x20   try:\n\
         \x20       with open(path, 'rb') as f:\n\
         \x20           print(path, 'READ', f.read(4096).decode('latin-1').replace(chr(10), ' '), flush=True)\n\
         \x20   except OSError as e:\n\
         \x20       print(path, 'exists' if os.path.lexists(path) else 'absent', e.errno, flush=True)\n"
    );
    let r = vm_run(["--timeout", "60s", "--", "/usr/bin/python3", "-c", &code]).json();
    r.assert_exit(0);
    let stdout = r.stdout();
    let line = |path: &str| {
        stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(path))
            .unwrap_or_else(|| panic!("no probe line for {path}\n{}", r.describe()))
            .to_owned()
    };
    assert!(
        line("/etc/os-release").contains(" READ "),
        "positive control: the guest reads its own files\n{}",
        r.describe()
    );
    for secret in [&in_tmp.secret, &in_root.secret] {
        assert!(
            !stdout.contains(secret.as_str()) && !r.stderr().contains(secret.as_str()),
            "a host canary leaked\n{}",
            r.describe()
        );
    }
    for path in &probes[..5] {
        assert!(line(path).starts_with(&format!("{path} absent")), "{path} is visible in the guest\n{}", r.describe());
    }
    assert_no_microvm_leaks(&r.id());
}

/// The modification time and size of a host file, to see whether anything wrote it.
fn written_state(path: &std::path::Path) -> (std::time::SystemTime, u64) {
    let meta = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (meta.modified().unwrap(), meta.len())
}

#[test]
fn guest_program_cannot_open_the_agent_port_the_raw_disks_or_guest_memory() {
    require_microvm!();
    let shared = [
        std::path::PathBuf::from("/var/lib/sandkasten/microvm/rootfs.ext4"),
        std::path::PathBuf::from("/var/lib/sandkasten/microvm/vmlinuz"),
    ];
    let before: Vec<_> = shared.iter().map(|p| written_state(p)).collect();
    // Whoever opens the agent's port speaks for the agent to the host; a raw disk is the template every sandbox
    // boots from, or the agent itself; /dev/mem and /proc/1/mem are the guest kernel's and the agent's memory.
    let code = "import glob, os\n\
                targets = sorted(glob.glob('/dev/vport*') + glob.glob('/dev/vd*')) + ['/dev/mem', '/dev/ttyS0', \
                '/dev/console', '/dev/kmsg', '/proc/1/mem', '/.sandkasten/agent/sandkasten', '/dev/null']\n\
                print('ports', len(glob.glob('/dev/vport*')), 'disks', len(glob.glob('/dev/vd*')), flush=True)\n\
                for path in targets:\n\
                \x20   try:\n\
                \x20       os.close(os.open(path, os.O_RDWR))\n\
                \x20       print(path, 'OPENED', flush=True)\n\
                \x20   except OSError as e:\n\
                \x20       print(path, 'refused', e.errno, flush=True)\n\
                raise SystemExit(7)\n";
    let r = vm_run(["--timeout", "60s", "--", "/usr/bin/python3", "-c", code]).json();
    r.assert_exit(7);
    let stdout = r.stdout();
    let counts = stdout.lines().next().unwrap_or_default();
    assert!(counts.starts_with("ports 1 disks 3"), "the guest's devices are not the ones expected\n{}", r.describe());
    // Positive control: the probe opens what it may.
    assert!(stdout.lines().any(|l| l == "/dev/null OPENED"), "positive control\n{}", r.describe());
    let opened: Vec<&str> = stdout.lines().filter(|l| l.ends_with(" OPENED") && !l.starts_with("/dev/null ")).collect();
    assert!(opened.is_empty(), "the sandbox's program opened {opened:?}\n{}", r.describe());
    let refused = stdout.lines().filter(|l| l.contains(" refused ")).count();
    assert_eq!(refused, 4 + 6, "every target but /dev/null is probed and refused\n{}", r.describe());
    let after: Vec<_> = shared.iter().map(|p| written_state(p)).collect();
    assert_eq!(before, after, "a shared boot file changed on the host during the run");
    assert_no_microvm_leaks(&r.id());
}
