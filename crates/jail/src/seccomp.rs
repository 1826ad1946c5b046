//! seccomp-bpf for sandboxed programs. The policy is data (`resources/seccomp/x86_64.json`, seccompiler's JSON
//! format, a comment on every rule) and has two filters:
//! - `sandbox`: an allowlist; every other syscall fails with EPERM. `socket` is limited to unix, tcp, udp and ping
//!   sockets, `ioctl` refuses TIOCSTI/TIOCLINUX/TIOCSETD, `clone` refuses namespace flags, `personality` only
//!   switches personas.
//! - `clone3`: makes `clone3` fail with ENOSYS (its flags live in memory that seccomp cannot inspect), so glibc
//!   falls back to `clone`, whose flags the sandbox filter checks. It is installed after `sandbox`: for two ERRNO
//!   results the kernel returns the most recently installed filter's, so ENOSYS wins; without it, EPERM.
//!
//! The VMM of a microVM (QEMU, in a process-tier jail) runs under `sandbox` with the few rules of `VMM_RELAXED`
//! lifted ([`SandboxFilter::compile_vmm`]): derived from the same data, so the two allowlists cannot drift apart.
//!
//! Compile once in the parent ([`SandboxFilter::compile`]), install in the forked child right before `execve`
//! ([`SandboxFilter::apply`]).

use seccompiler::{BpfProgram, TargetArch};

/// The policy for x86_64, embedded at build time.
const POLICY_X86_64: &str = include_str!("../../../resources/seccomp/x86_64.json");
/// Name of the allowlist filter in the policy.
const SANDBOX_FILTER: &str = "sandbox";
/// Name of the filter that turns `clone3` into ENOSYS.
const CLONE3_FILTER: &str = "clone3";

/// Syscalls that must never be allowed. The policy test checks that none of them is in the allowlist and that each
/// fails with EPERM under the filter. (`personality` is missing on purpose: it is allowed for the plain personas.)
pub const DENIED_SYSCALLS: &[&str] = &[
    // other processes' memory and state
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "process_madvise",
    "process_mrelease",
    "kcmp",
    "pidfd_getfd",
    // kernel keyrings
    "keyctl",
    "add_key",
    "request_key",
    // large kernel attack surface
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "modify_ldt",
    // mounts and namespaces
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    // kernel modules and kexec
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "get_kernel_syms",
    "query_module",
    "kexec_load",
    "kexec_file_load",
    // host-wide state
    "reboot",
    "swapon",
    "swapoff",
    "clock_settime",
    "clock_adjtime",
    "settimeofday",
    "adjtimex",
    "sethostname",
    "setdomainname",
    "acct",
    "quotactl",
    "quotactl_fd",
    "syslog",
    "vhangup",
    "iopl",
    "ioperm",
    "lsm_set_self_attr",
    // file handles bypass path-based checks
    "name_to_handle_at",
    "open_by_handle_at",
    "fanotify_init",
    // numa placement of memory
    "mbind",
    "set_mempolicy",
    "set_mempolicy_home_node",
    "migrate_pages",
    "move_pages",
    // obsolete
    "lookup_dcookie",
    "nfsservctl",
    "uselib",
];

/// The rules of the `sandbox` filter whose argument conditions the VMM's filter drops, each with why that is
/// harmless there.
pub const VMM_RELAXED: &[(&str, &str)] = &[(
    "fadvise64",
    "QEMU's block layer drops the page cache of its disk descriptors (POSIX_FADV_DONTNEED) when it takes the disks \
     over after a migration (`cont` after saving a memory snapshot, the start of a restored VM), and fails the \
     migration when refused. The VMM runs no code of the sandbox's: the guest reaches the host page cache only \
     through QEMU's block layer. What a compromised QEMU could evict is the cache of the files it holds (its own \
     disk, the shared read-only root and agent images): neighbours re-read those, nothing is exposed",
)];

/// A failed seccomp step.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The policy exists only for x86_64 so far.
    #[error("no seccomp policy for architecture {0}")]
    UnsupportedArch(&'static str),
    /// The embedded JSON policy did not compile.
    #[error("compile seccomp policy")]
    Compile(#[source] seccompiler::Error),
    /// The embedded policy is not the JSON it should be (deriving the VMM's filter from it).
    #[error("seccomp policy is malformed: {0}")]
    Malformed(String),
    /// The embedded policy lacks one of the filters.
    #[error("seccomp policy has no filter named {0}")]
    MissingFilter(&'static str),
    /// `prctl(PR_SET_NO_NEW_PRIVS)` or `seccomp(SECCOMP_SET_MODE_FILTER)` failed.
    #[error("install seccomp filter {filter}")]
    Install {
        /// Which filter of the policy.
        filter: &'static str,
        /// What failed.
        #[source]
        source: seccompiler::Error,
    },
}

/// The compiled filters for sandboxed programs; compile once, install in the child right before `execve`.
#[derive(Debug, Clone)]
pub struct SandboxFilter {
    /// The allowlist (mismatch: EPERM).
    sandbox: BpfProgram,
    /// `clone3` → ENOSYS, everything else allowed; installed after `sandbox` so its ENOSYS wins.
    clone3: BpfProgram,
}

impl SandboxFilter {
    /// Compiles the embedded policy for the running architecture (x86_64 only for now).
    pub fn compile() -> Result<SandboxFilter, SeccompError> {
        SandboxFilter::compile_policy(POLICY_X86_64)
    }

    /// The filters for a VMM: the sandbox allowlist with the rules of `VMM_RELAXED` unconditional.
    pub fn compile_vmm() -> Result<SandboxFilter, SeccompError> {
        let mut policy: serde_json::Value =
            serde_json::from_str(POLICY_X86_64).map_err(|e| SeccompError::Malformed(e.to_string()))?;
        let rules = policy
            .get_mut(SANDBOX_FILTER)
            .and_then(|filter| filter.get_mut("filter"))
            .and_then(serde_json::Value::as_array_mut)
            .ok_or(SeccompError::MissingFilter(SANDBOX_FILTER))?;
        for (syscall, _) in VMM_RELAXED {
            let rule = rules
                .iter_mut()
                .find(|rule| rule.get("syscall").and_then(serde_json::Value::as_str) == Some(syscall))
                .and_then(serde_json::Value::as_object_mut)
                .ok_or_else(|| SeccompError::Malformed(format!("no rule for {syscall} to relax")))?;
            rule.remove("args");
        }
        SandboxFilter::compile_policy(&policy.to_string())
    }

    fn compile_policy(policy: &str) -> Result<SandboxFilter, SeccompError> {
        let arch = match std::env::consts::ARCH {
            "x86_64" => TargetArch::x86_64,
            other => return Err(SeccompError::UnsupportedArch(other)),
        };
        let mut programs = seccompiler::compile_from_json(policy.as_bytes(), arch).map_err(SeccompError::Compile)?;
        let sandbox = programs.remove(SANDBOX_FILTER).ok_or(SeccompError::MissingFilter(SANDBOX_FILTER))?;
        let clone3 = programs.remove(CLONE3_FILTER).ok_or(SeccompError::MissingFilter(CLONE3_FILTER))?;
        Ok(SandboxFilter { sandbox, clone3 })
    }

    /// Installs the filters on the calling thread; sets `no_new_privs` first (a no-op if already set). Meant for a
    /// forked child: it does not allocate, it only makes the prctl/seccomp syscalls on the prebuilt programs.
    pub fn apply(&self) -> Result<(), SeccompError> {
        seccompiler::apply_filter(&self.sandbox)
            .map_err(|source| SeccompError::Install { filter: SANDBOX_FILTER, source })?;
        // Needs `seccomp` in the sandbox allowlist, which it is (filters can only tighten).
        seccompiler::apply_filter(&self.clone3)
            .map_err(|source| SeccompError::Install { filter: CLONE3_FILTER, source })
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
#[allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::io;
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    use serde_json::Value;

    fn policy() -> Value {
        serde_json::from_str(POLICY_X86_64).unwrap()
    }

    fn rules(filter: &str) -> Vec<Value> {
        policy()[filter]["filter"].as_array().unwrap().clone()
    }

    fn filter() -> SandboxFilter {
        SandboxFilter::compile().unwrap()
    }

    /// Forks; the child installs the filters, runs `probe` and exits with its result (0 or an errno); the parent
    /// returns that code. The child must not allocate: `probe` only makes raw syscalls.
    fn in_filtered_child(probe: impl FnOnce() -> libc::c_long) -> i32 {
        in_child_under(&filter(), probe)
    }

    /// `in_filtered_child` under `filter`.
    fn in_child_under(filter: &SandboxFilter, probe: impl FnOnce() -> libc::c_long) -> i32 {
        // SAFETY: the child only calls the non-allocating apply(), raw syscalls and _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = match filter.apply() {
                Err(_) => 200,
                Ok(()) => {
                    if probe() >= 0 {
                        0
                    } else {
                        // SAFETY: reading errno of this thread.
                        unsafe { *libc::__errno_location() }
                    }
                }
            };
            // SAFETY: leave the forked child without running any of the parent's code.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child with a valid status pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "child died: status {status:#x}");
        let code = libc::WEXITSTATUS(status);
        assert_ne!(code, 200, "installing the filter failed");
        code
    }

    /// x86_64 numbers of the denied syscalls (libc lacks a few; those are from arch/x86/entry/syscalls/syscall_64.tbl).
    fn denied_syscall_nr(name: &str) -> libc::c_long {
        match name {
            "ptrace" => libc::SYS_ptrace,
            "process_vm_readv" => libc::SYS_process_vm_readv,
            "process_vm_writev" => libc::SYS_process_vm_writev,
            "process_madvise" => libc::SYS_process_madvise,
            "process_mrelease" => libc::SYS_process_mrelease,
            "kcmp" => libc::SYS_kcmp,
            "pidfd_getfd" => libc::SYS_pidfd_getfd,
            "keyctl" => libc::SYS_keyctl,
            "add_key" => libc::SYS_add_key,
            "request_key" => libc::SYS_request_key,
            "bpf" => libc::SYS_bpf,
            "perf_event_open" => libc::SYS_perf_event_open,
            "userfaultfd" => libc::SYS_userfaultfd,
            "io_uring_setup" => libc::SYS_io_uring_setup,
            "io_uring_enter" => libc::SYS_io_uring_enter,
            "io_uring_register" => libc::SYS_io_uring_register,
            "modify_ldt" => libc::SYS_modify_ldt,
            "mount" => libc::SYS_mount,
            "umount2" => libc::SYS_umount2,
            "pivot_root" => libc::SYS_pivot_root,
            "chroot" => libc::SYS_chroot,
            "unshare" => libc::SYS_unshare,
            "setns" => libc::SYS_setns,
            "open_tree" => libc::SYS_open_tree,
            "move_mount" => libc::SYS_move_mount,
            "fsopen" => libc::SYS_fsopen,
            "fsconfig" => libc::SYS_fsconfig,
            "fsmount" => libc::SYS_fsmount,
            "fspick" => libc::SYS_fspick,
            "mount_setattr" => libc::SYS_mount_setattr,
            "init_module" => libc::SYS_init_module,
            "finit_module" => libc::SYS_finit_module,
            "delete_module" => libc::SYS_delete_module,
            "create_module" => 174,
            "get_kernel_syms" => 177,
            "query_module" => 178,
            "kexec_load" => libc::SYS_kexec_load,
            "kexec_file_load" => libc::SYS_kexec_file_load,
            "reboot" => libc::SYS_reboot,
            "swapon" => libc::SYS_swapon,
            "swapoff" => libc::SYS_swapoff,
            "clock_settime" => libc::SYS_clock_settime,
            "clock_adjtime" => libc::SYS_clock_adjtime,
            "settimeofday" => libc::SYS_settimeofday,
            "adjtimex" => libc::SYS_adjtimex,
            "sethostname" => libc::SYS_sethostname,
            "setdomainname" => libc::SYS_setdomainname,
            "acct" => libc::SYS_acct,
            "quotactl" => libc::SYS_quotactl,
            "quotactl_fd" => libc::SYS_quotactl_fd,
            "syslog" => libc::SYS_syslog,
            "vhangup" => libc::SYS_vhangup,
            "iopl" => libc::SYS_iopl,
            "ioperm" => libc::SYS_ioperm,
            "lsm_set_self_attr" => 460,
            "name_to_handle_at" => libc::SYS_name_to_handle_at,
            "open_by_handle_at" => libc::SYS_open_by_handle_at,
            "fanotify_init" => libc::SYS_fanotify_init,
            "mbind" => libc::SYS_mbind,
            "set_mempolicy" => libc::SYS_set_mempolicy,
            "set_mempolicy_home_node" => libc::SYS_set_mempolicy_home_node,
            "migrate_pages" => libc::SYS_migrate_pages,
            "move_pages" => libc::SYS_move_pages,
            "lookup_dcookie" => libc::SYS_lookup_dcookie,
            "nfsservctl" => libc::SYS_nfsservctl,
            "uselib" => libc::SYS_uselib,
            other => panic!("add {other} to denied_syscall_nr"),
        }
    }

    // ---- the policy as data

    #[test]
    fn policy_compiles() {
        let filter = filter();
        assert!(!filter.sandbox.is_empty());
        assert!(!filter.clone3.is_empty());
    }

    #[test]
    fn every_rule_has_a_comment() {
        for name in [SANDBOX_FILTER, CLONE3_FILTER] {
            for rule in rules(name) {
                let comment = rule["comment"].as_str().unwrap_or_default();
                assert!(!comment.trim().is_empty(), "rule without a comment in {name}: {rule}");
                for arg in rule["args"].as_array().into_iter().flatten() {
                    let comment = arg["comment"].as_str().unwrap_or_default();
                    assert!(!comment.trim().is_empty(), "condition without a comment: {rule}");
                }
            }
        }
    }

    #[test]
    fn denied_syscalls_are_not_in_the_allowlist() {
        let allowed: Vec<String> =
            rules(SANDBOX_FILTER).iter().map(|rule| rule["syscall"].as_str().unwrap().to_owned()).collect();
        for denied in DENIED_SYSCALLS.iter().chain(&["clone3"]) {
            assert!(!allowed.iter().any(|name| name == denied), "{denied} is in the allowlist");
        }
    }

    #[test]
    fn denied_syscall_names_are_real_syscalls() {
        // A typo in DENIED_SYSCALLS would make the allowlist check vacuous: seccompiler rejects unknown names.
        let filter: Vec<Value> = DENIED_SYSCALLS.iter().map(|name| serde_json::json!({ "syscall": name })).collect();
        let policy = serde_json::json!({
            "denied": { "mismatch_action": "allow", "match_action": { "errno": 1 }, "filter": filter }
        });
        seccompiler::compile_from_json(policy.to_string().as_bytes(), TargetArch::x86_64).unwrap();
    }

    #[test]
    fn no_rule_is_redundant() {
        // seccompiler ORs the rules of one syscall; an unconditional rule next to conditional ones is dropped
        // silently, and a second unconditional rule is dead weight: both are mistakes.
        let mut seen: HashMap<String, (usize, usize)> = HashMap::new();
        for rule in rules(SANDBOX_FILTER) {
            let name = rule["syscall"].as_str().unwrap().to_owned();
            let entry = seen.entry(name).or_default();
            if rule.get("args").is_some() {
                entry.1 += 1;
            } else {
                entry.0 += 1;
            }
        }
        for (name, (unconditional, conditional)) in seen {
            assert!(unconditional <= 1, "{name} is allowed unconditionally {unconditional} times");
            assert!(unconditional == 0 || conditional == 0, "{name} has an unconditional rule and conditional ones");
        }
    }

    // ---- the filter in a real process

    /// Makes syscall `nr` with integer arguments in a filtered child; returns 0 or its errno.
    fn errno_of(nr: libc::c_long, args: [libc::c_long; 3]) -> i32 {
        in_filtered_child(|| {
            // SAFETY: the arguments are plain integers (flags, ids, 0 for pointers), never addresses of memory the
            // kernel could write to; the probes that pass buffers make their own call.
            unsafe { libc::syscall(nr, args[0], args[1], args[2], 0, 0, 0) }
        })
    }

    #[test]
    fn only_the_vmm_may_drop_page_cache() {
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let dontneed = || {
            // SAFETY: fadvise on a descriptor this process holds, whole file, plain integers.
            unsafe { libc::syscall(libc::SYS_fadvise64, fd, 0, 0, libc::POSIX_FADV_DONTNEED) }
        };
        let willneed = || {
            // SAFETY: as above.
            unsafe { libc::syscall(libc::SYS_fadvise64, fd, 0, 0, libc::POSIX_FADV_WILLNEED) }
        };
        assert_eq!(in_filtered_child(dontneed), libc::EPERM, "a sandboxed program evicts host page cache");
        assert_eq!(in_filtered_child(willneed), 0);
        let vmm = SandboxFilter::compile_vmm().unwrap();
        assert_eq!(in_child_under(&vmm, dontneed), 0, "QEMU's migration needs POSIX_FADV_DONTNEED");
        // Everything else is the sandbox's allowlist.
        assert_eq!(in_child_under(&vmm, || unsafe_syscall0(libc::SYS_vhangup)), libc::EPERM);
        for (syscall, why) in VMM_RELAXED {
            assert!(rules(SANDBOX_FILTER).iter().any(|rule| rule["syscall"] == *syscall), "{syscall} has no rule");
            assert!(!DENIED_SYSCALLS.contains(syscall) && why.len() > 40, "{syscall}: {why}");
        }
    }

    fn unsafe_syscall0(nr: libc::c_long) -> libc::c_long {
        // SAFETY: a syscall without arguments that the filter refuses before it runs.
        unsafe { libc::syscall(nr) }
    }

    #[test]
    fn every_denied_syscall_fails_with_eperm() {
        for name in DENIED_SYSCALLS {
            // vhangup with a broken filter would hang up the test's terminal; its absence is checked above.
            if *name == "vhangup" {
                continue;
            }
            let code = errno_of(denied_syscall_nr(name), [0, 0, 0]);
            assert_eq!(code, libc::EPERM, "{name} returned errno {code}");
        }
    }

    #[test]
    fn ptrace_traceme_is_denied() {
        let code = errno_of(libc::SYS_ptrace, [libc::PTRACE_TRACEME.into(), 0, 0]);
        assert_eq!(code, libc::EPERM);
    }

    #[test]
    fn keyctl_is_denied() {
        const KEYCTL_GET_KEYRING_ID: libc::c_long = 0;
        const KEY_SPEC_SESSION_KEYRING: libc::c_long = -3;
        let code = errno_of(libc::SYS_keyctl, [KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0]);
        assert_eq!(code, libc::EPERM);
    }

    #[test]
    fn bpf_is_denied() {
        const BPF_PROG_LOAD: libc::c_long = 5;
        assert_eq!(errno_of(libc::SYS_bpf, [BPF_PROG_LOAD, 0, 0]), libc::EPERM);
    }

    #[test]
    fn io_uring_is_denied() {
        let code = in_filtered_child(|| {
            let mut params = [0u8; 120];
            // SAFETY: `params` (sizeof struct io_uring_params) outlives the call.
            unsafe { libc::syscall(libc::SYS_io_uring_setup, 8, params.as_mut_ptr()) }
        });
        assert_eq!(code, libc::EPERM);
    }

    #[test]
    fn new_user_namespace_is_denied() {
        let code = errno_of(libc::SYS_unshare, [libc::CLONE_NEWUSER.into(), 0, 0]);
        assert_eq!(code, libc::EPERM);
    }

    /// Fork-style clone (no new stack) with `flags` in a filtered child; a grandchild that does get created exits
    /// at once and is reaped.
    fn clone_errno(flags: libc::c_int) -> i32 {
        in_filtered_child(|| {
            // SAFETY: fork semantics (copy-on-write stack), no pointers.
            let pid = unsafe { libc::syscall(libc::SYS_clone, flags | libc::SIGCHLD, 0, 0, 0, 0) };
            if pid == 0 {
                // SAFETY: the grandchild leaves at once.
                unsafe { libc::_exit(0) };
            }
            if pid > 0 {
                // SAFETY: reaping our own child; a null status pointer is allowed.
                unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0) };
            }
            pid
        })
    }

    #[test]
    fn clone_with_namespace_flags_is_denied() {
        for flag in [
            libc::CLONE_NEWNS,
            libc::CLONE_NEWCGROUP,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
        ] {
            assert_eq!(clone_errno(flag), libc::EPERM, "clone flag {flag:#x}");
        }
    }

    #[test]
    fn plain_clone_is_allowed() {
        assert_eq!(clone_errno(0), 0);
    }

    #[test]
    fn clone3_fails_with_enosys() {
        let code = in_filtered_child(|| {
            let args = [0u64; 8];
            // SAFETY: a zeroed clone_args of the v0 size that outlives the call.
            let pid = unsafe { libc::syscall(libc::SYS_clone3, args.as_ptr(), size_of_val(&args)) };
            if pid == 0 {
                // SAFETY: a clone3 that got through must not continue as a second copy of the probe.
                unsafe { libc::_exit(0) };
            }
            pid
        });
        assert_eq!(code, libc::ENOSYS);
    }

    fn socket_errno(domain: libc::c_int, ty: libc::c_int) -> i32 {
        errno_of(libc::SYS_socket, [domain.into(), ty.into(), 0])
    }

    #[test]
    fn packet_sockets_are_denied() {
        assert_eq!(socket_errno(libc::AF_PACKET, libc::SOCK_RAW), libc::EPERM);
        assert_eq!(socket_errno(libc::AF_PACKET, libc::SOCK_DGRAM), libc::EPERM);
    }

    #[test]
    fn netlink_sockets_are_denied() {
        assert_eq!(socket_errno(libc::AF_NETLINK, libc::SOCK_RAW), libc::EPERM);
        assert_eq!(socket_errno(libc::AF_NETLINK, libc::SOCK_DGRAM), libc::EPERM);
    }

    #[test]
    fn raw_inet_sockets_are_denied_by_the_filter() {
        // The test runs as root, so without the filter these would succeed.
        assert_eq!(socket_errno(libc::AF_INET, libc::SOCK_RAW), libc::EPERM);
        assert_eq!(socket_errno(libc::AF_INET6, libc::SOCK_RAW | libc::SOCK_CLOEXEC), libc::EPERM);
    }

    #[test]
    fn other_inet_protocols_are_denied() {
        const IPPROTO_L2TP: libc::c_long = 115;
        const IPPROTO_MPTCP: libc::c_long = 262;
        let inet = libc::AF_INET.into();
        let stream = libc::SOCK_STREAM.into();
        let dgram = libc::SOCK_DGRAM.into();
        // Each of these could make the kernel auto-load a protocol module.
        assert_eq!(errno_of(libc::SYS_socket, [inet, stream, libc::IPPROTO_SCTP.into()]), libc::EPERM);
        assert_eq!(errno_of(libc::SYS_socket, [inet, dgram, IPPROTO_L2TP]), libc::EPERM);
        assert_eq!(errno_of(libc::SYS_socket, [inet, dgram, libc::IPPROTO_UDPLITE.into()]), libc::EPERM);
        assert_eq!(errno_of(libc::SYS_socket, [inet, stream, IPPROTO_MPTCP]), libc::EPERM);
        const SOCK_DCCP: libc::c_long = 6;
        assert_eq!(errno_of(libc::SYS_socket, [inet, SOCK_DCCP, 0]), libc::EPERM);
    }

    #[test]
    fn tcp_udp_and_unix_sockets_are_allowed() {
        let tcp = libc::IPPROTO_TCP.into();
        let udp = libc::IPPROTO_UDP.into();
        let stream = libc::SOCK_STREAM.into();
        let dgram = libc::SOCK_DGRAM.into();
        assert_eq!(errno_of(libc::SYS_socket, [libc::AF_INET.into(), stream, tcp]), 0);
        assert_eq!(errno_of(libc::SYS_socket, [libc::AF_INET6.into(), dgram, udp]), 0);
        assert_eq!(socket_errno(libc::AF_INET, libc::SOCK_STREAM), 0);
        assert_eq!(socket_errno(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_NONBLOCK), 0);
        assert_eq!(socket_errno(libc::AF_INET6, libc::SOCK_STREAM | libc::SOCK_CLOEXEC), 0);
        assert_eq!(socket_errno(libc::AF_UNIX, libc::SOCK_SEQPACKET), 0);
    }

    /// ioctl(0, `cmd`, &buf) in a filtered child.
    fn ioctl_errno(cmd: u64) -> i32 {
        in_filtered_child(|| {
            let buf = [b'x', 0, 0, 0];
            // SAFETY: `buf` outlives the call; TIOCSTI reads one byte, TIOCLINUX and TIOCSETD at most four.
            unsafe { libc::syscall(libc::SYS_ioctl, 0, cmd, buf.as_ptr()) }
        })
    }

    #[test]
    fn terminal_input_injection_is_denied() {
        const TIOCLINUX: u64 = 0x541C;
        assert_eq!(ioctl_errno(libc::TIOCSTI), libc::EPERM);
        assert_eq!(ioctl_errno(TIOCLINUX), libc::EPERM);
        assert_eq!(ioctl_errno(libc::TIOCSETD), libc::EPERM);
        // High bits must not smuggle the request past the filter: the kernel truncates cmd to 32 bits.
        assert_eq!(ioctl_errno((1 << 32) | libc::TIOCSTI), libc::EPERM);
    }

    #[test]
    fn ordinary_ioctls_are_allowed() {
        let code = in_filtered_child(|| {
            let mut fds = [0; 2];
            let mut n: libc::c_int = 0;
            // SAFETY: `fds` has room for the two descriptors pipe() writes.
            if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
                return -1;
            }
            // SAFETY: FIONREAD writes one int into `n`, which outlives the call.
            unsafe { libc::syscall(libc::SYS_ioctl, fds[0], libc::FIONREAD, &mut n as *mut libc::c_int) }
        });
        assert_eq!(code, 0);
    }

    #[test]
    fn personality_only_switches_personas() {
        const ADDR_NO_RANDOMIZE: libc::c_long = 0x0040000;
        assert_eq!(errno_of(libc::SYS_personality, [0xffff_ffff, 0, 0]), 0);
        assert_eq!(errno_of(libc::SYS_personality, [ADDR_NO_RANDOMIZE, 0, 0]), libc::EPERM);
    }

    // ---- real programs under the filter

    /// Runs `program args` with the filters installed between fork and exec, returns its stdout; panics with its
    /// stderr if it fails.
    fn run_filtered(program: &str, args: &[&str], dir: Option<&std::path::Path>) -> String {
        let filter = filter();
        let mut command = Command::new(program);
        command.args(args);
        if let Some(dir) = dir {
            command.current_dir(dir);
        }
        // SAFETY: apply() does not allocate; the error path builds an io::Error from a raw errno only.
        unsafe {
            command.pre_exec(move || filter.apply().map_err(|_| io::Error::from_raw_os_error(libc::EPERM)));
        }
        let output = command.output().unwrap();
        assert!(
            output.status.success(),
            "{program} {args:?} failed under the filter: {}\nstdout: {}\nstderr: {}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn scratch_dir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("sandkasten-seccomp-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn python_runs_under_the_filter() {
        let out = run_filtered(
            "/usr/bin/python3",
            &["-c", "import json,subprocess; print(subprocess.run([\"/bin/true\"]).returncode)"],
            None,
        );
        assert_eq!(out.trim(), "0");
    }

    #[test]
    fn python_threads_multiprocessing_and_sockets_work_under_the_filter() {
        let script = r#"
import asyncio, concurrent.futures, multiprocessing, socket, tempfile, os, sqlite3, ssl, hashlib
with concurrent.futures.ThreadPoolExecutor(4) as ex: assert sum(ex.map(abs, range(-3, 1))) == 6
with multiprocessing.Pool(2) as pool: assert pool.map(abs, [-1, -2]) == [1, 2]
a, b = socket.socketpair(); a.send(b"x"); assert b.recv(1) == b"x"
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); c = socket.create_connection(s.getsockname()); c.close(); s.close()
asyncio.run(asyncio.sleep(0.01))
with tempfile.TemporaryDirectory() as d:
    db = sqlite3.connect(os.path.join(d, "x.db")); db.execute("create table t(x)"); db.commit(); db.close()
print("ok")
"#;
        let out = run_filtered("/usr/bin/python3", &["-c", script], None);
        assert_eq!(out.trim(), "ok");
    }

    #[test]
    fn node_runs_under_the_filter() {
        let out = run_filtered("/usr/bin/node", &["-e", "console.log(1+1)"], None);
        assert_eq!(out.trim(), "2");
    }

    #[test]
    fn node_workers_child_processes_and_fs_work_under_the_filter() {
        let script = r#"
const { Worker } = require('worker_threads');
const cp = require('child_process'); const fs = require('fs'); const os = require('os'); const path = require('path');
const d = fs.mkdtempSync(path.join(os.tmpdir(), 'sk-')); fs.writeFileSync(path.join(d, 'a'), 'x');
fs.promises.readFile(path.join(d, 'a'), 'utf8').then(async (t) => {
  if (t !== 'x') throw new Error('read');
  if (cp.execFileSync('/bin/echo', ['hi']).toString().trim() !== 'hi') throw new Error('exec');
  const w = new Worker('require("worker_threads").parentPort.postMessage(21*2)', { eval: true });
  const v = await new Promise((r) => w.on('message', r)); await w.terminate();
  require('crypto').randomBytes(8);
  fs.rmSync(d, { recursive: true });
  console.log(v);
});
"#;
        let out = run_filtered("/usr/bin/node", &["-e", script], None);
        assert_eq!(out.trim(), "42");
    }

    #[test]
    fn gcc_compiles_and_runs_under_the_filter() {
        let dir = scratch_dir("gcc");
        std::fs::write(dir.join("hello.c"), "#include <stdio.h>\nint main(void){puts(\"hello\");return 0;}\n").unwrap();
        let out = run_filtered("/bin/sh", &["-c", "/usr/bin/gcc -O2 -o hello hello.c && ./hello"], Some(&dir));
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(out.trim(), "hello");
    }

    #[test]
    fn shell_coreutils_and_git_work_under_the_filter() {
        let dir = scratch_dir("git");
        let script = "set -e; mkdir -p a/b; echo hi > a/b/f; cp -a a c; tar cf x.tar c; rm -rf c; tar xf x.tar; \
            sort a/b/f | uniq | wc -l > n; ls -la >/dev/null; sleep 0.01 & wait; \
            git init -q repo; cd repo; echo x > f; git add f; \
            git -c user.email=a@b -c user.name=t commit -qm init; git log --oneline | wc -l";
        let out = run_filtered("/bin/bash", &["-c", script], Some(&dir));
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(out.trim(), "1");
    }
}
