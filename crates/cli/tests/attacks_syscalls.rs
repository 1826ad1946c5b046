//! Dangerous system calls fail inside the sandbox (seccomp, dropped capabilities, no_new_privs): ptrace, mount, unshare,
//! setns, keyctl, bpf, io_uring, userfaultfd, perf_event_open, clock setters, chroot, raw and packet sockets, clone3.
//!
//! Raw syscall numbers are x86_64. Arguments are real where the kernel would otherwise accept the call, so a missing
//! filter shows up as success rather than as EFAULT.
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use common::*;

per_tier!(
    ptrace_is_denied,
    mount_family_is_denied,
    namespace_creation_and_joining_is_denied,
    kernel_attack_surface_syscalls_are_denied,
    clone3_is_refused_with_enosys,
    raw_and_packet_sockets_are_denied,
    mount_and_unshare_commands_fail,
    clock_is_not_changed_on_host,
);

fn x86_64_only() -> bool {
    if cfg!(target_arch = "x86_64") {
        true
    } else {
        eprintln!("skipped: raw syscall numbers are x86_64");
        false
    }
}

/// Runs the calls in a python sandbox and asserts each failed with one of `allowed` errnos.
fn assert_calls_fail(tier: Tier, calls: &[(&str, i64, &str)], allowed: &[&str], prelude: &str) {
    assert_calls_fail_then(tier, calls, allowed, prelude, "");
}

/// Like `assert_calls_fail`, with python `epilogue` run after the calls (to clean up helpers).
fn assert_calls_fail_then(tier: Tier, calls: &[(&str, i64, &str)], allowed: &[&str], prelude: &str, epilogue: &str) {
    let code = python_syscalls(calls).replacen("keep = []\n", &format!("keep = []\n{prelude}\n"), 1) + epilogue;
    let r = code_on(tier, "python", &code, &["--timeout", "10s"]).json();
    let results = parse_syscall_lines(&r.stdout());
    let mut failures = Vec::new();
    for (name, _, _) in calls {
        match results.get(*name) {
            None => failures.push(format!("{name}: no result (sandbox died?)")),
            Some((rc, errno)) if *rc != -1 || !allowed.contains(&errno.as_str()) => {
                failures.push(format!("{name}: rc={rc} errno={errno}, expected -1 with {allowed:?}"))
            }
            Some(_) => {}
        }
    }
    assert!(failures.is_empty(), "syscalls not denied:\n  {}\n{}", failures.join("\n  "), r.describe());
    assert_gone(tier, &r.id());
}

fn ptrace_is_denied(tier: Tier) {
    if !x86_64_only() {
        return;
    }
    // PTRACE_TRACEME (0) and PTRACE_ATTACH (16) to a sibling child of the same uid; process_vm_readv on it too.
    let prelude = "import time, signal\nkid = os.fork()\nif kid == 0:\n    time.sleep(30); os._exit(0)\n";
    let calls = [
        ("ptrace_traceme", 101, "0, 0, 0, 0"),
        ("ptrace_attach_sibling", 101, "16, kid, 0, 0"),
        ("ptrace_seize_sibling", 101, "0x4206, kid, 0, 0"),
        ("process_vm_readv", 310, "kid, buf(16), 1, buf(16), 1, 0"),
        ("process_vm_writev", 311, "kid, buf(16), 1, buf(16), 1, 0"),
    ];
    assert_calls_fail_then(tier, &calls, &["EPERM"], prelude, "os.kill(kid, signal.SIGKILL)\nos.waitpid(kid, 0)\n");
}

fn mount_family_is_denied(tier: Tier) {
    if !x86_64_only() {
        return;
    }
    let prelude = "os.makedirs('/tmp/mnt', exist_ok=True)\n";
    let calls = [
        ("mount_tmpfs", 165, "cstr(b'x'), cstr(b'/tmp/mnt'), cstr(b'tmpfs'), 0, 0"),
        ("mount_bind_root", 165, "cstr(b'/'), cstr(b'/tmp/mnt'), 0, 4096, 0"),
        ("umount2_proc", 166, "cstr(b'/proc'), 2"),
        ("pivot_root", 155, "cstr(b'/tmp'), cstr(b'/tmp/mnt')"),
        ("fsopen", 430, "cstr(b'tmpfs'), 0"),
        ("open_tree", 428, "-100, cstr(b'/'), 1"),
        ("move_mount", 429, "-100, cstr(b'/tmp'), -100, cstr(b'/tmp/mnt'), 0"),
        ("chroot", 161, "cstr(b'/tmp'),"),
    ];
    assert_calls_fail(tier, &calls, &["EPERM"], prelude);
}

fn namespace_creation_and_joining_is_denied(tier: Tier) {
    if !x86_64_only() {
        return;
    }
    let prelude =
        "netns = os.open('/proc/self/ns/net', os.O_RDONLY)\nuserns = os.open('/proc/self/ns/user', os.O_RDONLY)\n";
    let calls = [
        ("unshare_user", 272, "0x10000000,"),
        ("unshare_net", 272, "0x40000000,"),
        ("unshare_mnt", 272, "0x00020000,"),
        ("unshare_pid", 272, "0x20000000,"),
        ("setns_net", 308, "netns, 0"),
        ("setns_user", 308, "userns, 0"),
    ];
    assert_calls_fail(tier, &calls, &["EPERM"], prelude);
}

fn kernel_attack_surface_syscalls_are_denied(tier: Tier) {
    if !x86_64_only() {
        return;
    }
    let calls = [
        // keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, create=1)
        ("keyctl", 250, "0, -3, 1"),
        ("add_key", 248, "cstr(b'user'), cstr(b'k'), cstr(b'v'), 1, -3"),
        ("request_key", 249, "cstr(b'user'), cstr(b'k'), 0, -3"),
        // bpf(BPF_MAP_CREATE) with a small array map
        ("bpf", 321, "0, buf(128), 128"),
        ("perf_event_open", 298, "buf(128), 0, -1, -1, 0"),
        // io_uring_setup(1, &params) with zeroed params: succeeds when not filtered
        ("io_uring_setup", 425, "1, buf(120)"),
        ("userfaultfd", 323, "0,"),
        ("kexec_load", 246, "0, 0, 0, 0"),
        ("init_module", 175, "buf(16), 16, cstr(b'')"),
        ("finit_module", 313, "0, cstr(b''), 0"),
        ("clock_settime", 227, "0, buf(16)"),
        ("settimeofday", 164, "buf(16), 0"),
        ("adjtimex", 159, "buf(256),"),
        ("sethostname", 170, "cstr(b'pwned'), 5"),
        ("swapon", 167, "cstr(b'/tmp/x'), 0"),
        ("acct", 163, "cstr(b'/tmp/acct'),"),
    ];
    assert_calls_fail(tier, &calls, &["EPERM"], "");
}

fn clone3_is_refused_with_enosys(tier: Tier) {
    if !x86_64_only() {
        return;
    }
    // Design: clone3 -> ENOSYS so libcs fall back to clone, which seccomp can inspect.
    assert_calls_fail(tier, &[("clone3", 435, "buf(88), 88")], &["ENOSYS"], "");
}

fn raw_and_packet_sockets_are_denied(tier: Tier) {
    let code = "import socket\n\
                for name, fam, typ, proto in [('raw_icmp', socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP), ('raw_tcp', socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP), ('raw6', socket.AF_INET6, socket.SOCK_RAW, 58), ('packet', socket.AF_PACKET, socket.SOCK_RAW, 0x0300), ('packet_dgram', socket.AF_PACKET, socket.SOCK_DGRAM, 0x0300), ('netlink_route', socket.AF_NETLINK, socket.SOCK_RAW, 0), ('vsock', 40, socket.SOCK_STREAM, 0), ('ping', socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)]:\n\
                \x20   try:\n\
                \x20       s = socket.socket(fam, typ, proto); print('OPENED', name); s.close()\n\
                \x20   except OSError as e:\n\
                \x20       print('denied', name, e.errno)\n";
    let r = code_on(tier, "python", code, &[]).json();
    r.assert_exit(0);
    let out = r.stdout();
    for name in ["raw_icmp", "raw_tcp", "raw6", "packet", "packet_dgram"] {
        assert!(out.contains(&format!("denied {name} ")), "{name} socket was opened\n{}", r.describe());
    }
    assert!(!out.contains("OPENED vsock"), "AF_VSOCK opened\n{}", r.describe());
    assert_gone(tier, &r.id());
}

fn mount_and_unshare_commands_fail(tier: Tier) {
    let code = "mkdir -p /tmp/x\n\
                mount -t tmpfs x /tmp/x 2>&1; echo mount=$?\n\
                unshare -r id -u 2>&1; echo unshare_r=$?\n\
                unshare -n true 2>&1; echo unshare_n=$?\n\
                unshare -U true 2>&1; echo unshare_U=$?\n\
                chroot / true 2>&1; echo chroot=$?\n\
                nsenter -t 1 -m true 2>&1; echo nsenter=$?\n\
                date -s '2001-01-01' 2>&1; echo date=$?\n";
    let r = code_on(tier, "bash", code, &["--timeout", "10s"]).json();
    let out = r.stdout();
    for cmd in ["mount", "unshare_r", "unshare_n", "unshare_U", "chroot", "nsenter", "date"] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{cmd}=")))
            .unwrap_or_else(|| panic!("{cmd} missing\n{}", r.describe()));
        assert_ne!(line, format!("{cmd}=0"), "{cmd} succeeded inside the sandbox\n{}", r.describe());
    }
    assert_gone(tier, &r.id());
}

fn clock_is_not_changed_on_host(tier: Tier) {
    let before = std::time::SystemTime::now();
    let r = code_on(tier, "bash", "date -s '2001-01-01' >/dev/null 2>&1; echo $?", &[]).json();
    let after = std::time::SystemTime::now();
    assert!(after >= before && after.duration_since(before).unwrap().as_secs() < 120, "host clock moved");
    assert_ne!(r.stdout().trim(), "0", "{}", r.describe());
    assert_gone(tier, &r.id());
}
