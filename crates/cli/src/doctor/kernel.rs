//! Kernel features of the process tier: seccomp filters (and that our policy compiles), the landlock ABI, and the
//! tmpfs and overlay filesystems.

use std::collections::BTreeSet;
use std::fs;

use sandkasten_jail::landlock;
use sandkasten_jail::seccomp::SandboxFilter;

use super::host;
use super::report::{Check, CheckId};

/// The kernel's supported filesystems.
const PROC_FILESYSTEMS: &str = "/proc/filesystems";
/// Listed only when the kernel has seccomp filter mode (CONFIG_SECCOMP_FILTER).
const SECCOMP_ACTIONS: &str = "/proc/sys/kernel/seccomp/actions_avail";

/// seccomp: the kernel has filter mode (the `Seccomp:` status field and the actions list), and the sandbox policy
/// compiles to BPF for this architecture.
pub fn seccomp() -> Check {
    let status = fs::read_to_string(host::PROC_SELF_STATUS).unwrap_or_default();
    let actions = fs::read_to_string(SECCOMP_ACTIONS).ok();
    let compiled = SandboxFilter::compile().map_err(|e| host::error_chain(&e));
    seccomp_verdict(host::status_field(&status, "Seccomp"), actions.as_deref(), compiled.map(|_| ()))
}

/// The seccomp verdict from the status field (`"0"` none, `"1"` strict, `"2"` filter: our own mode), the kernel's
/// action list and the policy compilation.
pub fn seccomp_verdict(mode: Option<&str>, actions: Option<&str>, compiled: Result<(), String>) -> Check {
    let Some(mode) = mode else {
        return Check::fail(
            CheckId::Seccomp,
            "no Seccomp field in /proc/self/status: kernel built without seccomp",
            "use a kernel with CONFIG_SECCOMP=y and CONFIG_SECCOMP_FILTER=y",
        );
    };
    let Some(actions) = actions else {
        return Check::fail(
            CheckId::Seccomp,
            format!("{SECCOMP_ACTIONS} is missing: kernel built without seccomp filters"),
            "use a kernel with CONFIG_SECCOMP_FILTER=y",
        );
    };
    let actions: BTreeSet<&str> = actions.split_whitespace().collect();
    if !["allow", "errno"].iter().all(|a| actions.contains(a)) {
        return Check::fail(
            CheckId::Seccomp,
            format!("kernel lacks the allow/errno filter actions (has: {})", join(&actions)),
            "use a kernel with CONFIG_SECCOMP_FILTER=y",
        );
    }
    if let Err(e) = compiled {
        return Check::fail(
            CheckId::Seccomp,
            format!("the sandbox policy does not compile: {e}"),
            "run on x86_64 (the only architecture with a policy so far) or report this as a bug",
        );
    }
    let own = match mode {
        "0" => String::new(),
        other => format!(", doctor itself already runs under mode {other}"),
    };
    Check::ok(CheckId::Seccomp, format!("filter mode available, policy compiles{own}"))
}

/// Landlock is optional (sandboxes then rely on the mount namespace alone), so a missing ABI only warns.
pub fn landlock() -> Check {
    landlock_verdict(landlock::kernel_abi())
}

/// The landlock verdict from the kernel's ABI version (0 = unavailable).
pub fn landlock_verdict(abi: i32) -> Check {
    if abi >= 1 {
        Check::ok(CheckId::Landlock, format!("ABI {abi}"))
    } else {
        Check::warn(
            CheckId::Landlock,
            "not available (ABI 0); sandboxes run without the landlock file-access layer",
            "boot with landlock enabled: CONFIG_SECURITY_LANDLOCK=y and `landlock` in the lsm= list",
        )
    }
}

/// tmpfs backs the sandbox's `/tmp` and `/workspace` (required); overlay is for writable layers over templates
/// (missing only warns).
pub fn filesystems() -> Check {
    match fs::read_to_string(PROC_FILESYSTEMS) {
        Ok(text) => filesystems_verdict(&host::parse_filesystems(&text)),
        Err(e) => Check::fail(CheckId::Filesystems, format!("cannot read {PROC_FILESYSTEMS}: {e}"), "mount /proc"),
    }
}

/// The filesystem verdict from the set of supported filesystem names.
pub fn filesystems_verdict(names: &BTreeSet<String>) -> Check {
    match (names.contains("tmpfs"), names.contains("overlay")) {
        (true, true) => Check::ok(CheckId::Filesystems, "tmpfs and overlay available"),
        (true, false) => Check::warn(
            CheckId::Filesystems,
            "tmpfs available, overlay missing",
            "load the overlay module (modprobe overlay) for template layers",
        ),
        (false, _) => Check::fail(
            CheckId::Filesystems,
            "tmpfs missing from /proc/filesystems",
            "use a kernel with CONFIG_TMPFS=y",
        ),
    }
}

fn join(set: &BTreeSet<&str>) -> String {
    set.iter().copied().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::report::Status;

    const ACTIONS: &str = "kill_process kill_thread trap errno user_notif trace log allow\n";

    #[test]
    fn seccomp_needs_the_field_the_actions_and_a_compiling_policy() {
        assert_eq!(seccomp_verdict(Some("0"), Some(ACTIONS), Ok(())).status, Status::Ok);
        assert_eq!(seccomp_verdict(None, Some(ACTIONS), Ok(())).status, Status::Fail);
        assert_eq!(seccomp_verdict(Some("0"), None, Ok(())).status, Status::Fail);
        assert_eq!(seccomp_verdict(Some("0"), Some("kill_process"), Ok(())).status, Status::Fail);
        let bad = seccomp_verdict(Some("0"), Some(ACTIONS), Err("boom".to_owned()));
        assert_eq!(bad.status, Status::Fail);
        assert!(bad.detail.contains("boom"));
    }

    #[test]
    fn seccomp_notes_when_doctor_is_already_filtered() {
        let check = seccomp_verdict(Some("2"), Some(ACTIONS), Ok(()));
        assert_eq!(check.status, Status::Ok);
        assert!(check.detail.contains("mode 2"));
    }

    #[test]
    fn the_embedded_policy_compiles() {
        assert!(SandboxFilter::compile().is_ok());
    }

    #[test]
    fn missing_landlock_only_warns() {
        assert_eq!(landlock_verdict(0).status, Status::Warn);
        assert_eq!(landlock_verdict(4).status, Status::Ok);
        assert_eq!(landlock_verdict(4).detail, "ABI 4");
    }

    #[test]
    fn tmpfs_is_required_and_overlay_optional() {
        let set = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<BTreeSet<_>>();
        assert_eq!(filesystems_verdict(&set(&["tmpfs", "overlay"])).status, Status::Ok);
        assert_eq!(filesystems_verdict(&set(&["tmpfs"])).status, Status::Warn);
        assert_eq!(filesystems_verdict(&set(&["overlay", "ext4"])).status, Status::Fail);
    }

    #[test]
    fn this_host_lists_filesystems() {
        let text = fs::read_to_string(PROC_FILESYSTEMS).unwrap_or_default();
        assert!(host::parse_filesystems(&text).contains("proc"));
    }
}
