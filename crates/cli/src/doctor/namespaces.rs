//! Checks for the process tier's privileges: running as root, and user namespaces (enabled, and one actually created
//! together with mount, pid and net namespaces, as the jail does).

use std::fs;
use std::io;
use std::path::Path;
use std::process::{Command, Stdio};

use super::host;
use super::report::{Check, CheckId};

/// The sysctl limiting user namespaces per user; 0 disables them.
const MAX_USER_NAMESPACES: &str = "/proc/sys/user/max_user_namespaces";
/// util-linux `unshare`, used to create the namespaces when present.
const UNSHARE: &str = "/usr/bin/unshare";
/// `CAP_SYS_ADMIN` (mounts, namespaces, cgroup writes).
const CAP_SYS_ADMIN: u32 = 21;

/// Root with `CAP_SYS_ADMIN`: the process tier writes cgroups and maps the sandbox's ids to a host range.
pub fn root() -> Check {
    let status = match fs::read_to_string(host::PROC_SELF_STATUS) {
        Ok(status) => status,
        Err(e) => {
            return Check::fail(CheckId::Root, format!("cannot read {}: {e}", host::PROC_SELF_STATUS), "mount /proc");
        }
    };
    root_from_status(&status)
}

/// The verdict from a `/proc/self/status` text.
pub fn root_from_status(status: &str) -> Check {
    match (host::effective_uid(status), host::has_effective_capability(status, CAP_SYS_ADMIN)) {
        (Some(0), Some(true)) => Check::ok(CheckId::Root, "uid 0 with CAP_SYS_ADMIN"),
        (Some(0), _) => Check::fail(
            CheckId::Root,
            "uid 0 but without CAP_SYS_ADMIN (an unprivileged container?)",
            "run sandkasten on the host or in a privileged container",
        ),
        (Some(uid), _) => Check::fail(
            CheckId::Root,
            format!("running as uid {uid}"),
            "run sandkasten as root (sudo): the process tier creates cgroups and maps sandbox ids to a host range",
        ),
        (None, _) => Check::fail(CheckId::Root, "no Uid line in /proc/self/status", "mount a standard /proc"),
    }
}

/// User namespaces: the sysctl allows them and creating user+mount+pid+net namespaces works.
pub fn user_namespaces() -> Check {
    let max = match fs::read_to_string(MAX_USER_NAMESPACES) {
        Ok(text) => text.trim().parse::<u64>().ok(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Check::fail(
                CheckId::UserNamespaces,
                format!("{MAX_USER_NAMESPACES} is missing: kernel built without user namespaces"),
                "use a kernel with CONFIG_USER_NS=y",
            );
        }
        Err(_) => None,
    };
    if max == Some(0) {
        return Check::fail(
            CheckId::UserNamespaces,
            "disabled (user.max_user_namespaces = 0)",
            "enable them: sysctl -w user.max_user_namespaces=15000 (and persist it in /etc/sysctl.d)",
        );
    }
    let max_text = max.map_or_else(|| "unknown".to_owned(), |m| m.to_string());
    let created = if Path::new(UNSHARE).is_file() { create_with_unshare_tool() } else { create_in_forked_child() };
    match created {
        Ok(how) => Check::ok(CheckId::UserNamespaces, format!("created one {how}(max {max_text})")),
        Err(why) => Check::fail(
            CheckId::UserNamespaces,
            format!("creating one failed: {why} (max {max_text})"),
            "allow unshare(CLONE_NEWUSER): check AppArmor (kernel.apparmor_restrict_unprivileged_userns), \
             kernel.unprivileged_userns_clone and any seccomp profile of the container sandkasten runs in",
        ),
    }
}

/// Runs `unshare --user --map-root-user --mount --pid --fork --net true`; `Err` carries its last stderr line.
fn create_with_unshare_tool() -> Result<&'static str, String> {
    let output = Command::new(UNSHARE)
        .args(["--user", "--map-root-user", "--mount", "--pid", "--fork", "--net", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("running {UNSHARE}: {e}"))?;
    if output.status.success() {
        Ok("")
    } else {
        Err(format!("{UNSHARE} exited with {}: {}", output.status, host::last_line(&output.stderr)))
    }
}

/// Without util-linux: a forked child calls `unshare(2)` with the jail's namespace flags and exits 0 without
/// exec'ing anything; the errno of a failed `unshare` comes back through `spawn`.
pub fn create_in_forked_child() -> Result<&'static str, String> {
    use std::os::unix::process::CommandExt as _;

    let flags = libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWNET;
    let mut command = Command::new("/nonexistent-never-executed");
    command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    let hook = move || -> io::Result<()> {
        // SAFETY: unshare takes no pointers; the forked child is single-threaded, so CLONE_NEWUSER is allowed.
        #[allow(unsafe_code)]
        let ret = unsafe { libc::unshare(flags) };
        if ret != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: _exit is async-signal-safe and ends the child here, before exec; `spawn` sees the exec-error
        // pipe close without an error and reports success, and the exit status 0 confirms it.
        #[allow(unsafe_code)]
        unsafe {
            libc::_exit(0)
        }
    };
    // SAFETY: the hook runs between fork and exec and only makes the two async-signal-safe calls above (no
    // allocation, no locks); `io::Error::last_os_error` only reads errno.
    #[allow(unsafe_code)]
    let command = unsafe { command.pre_exec(hook) };
    let status =
        command.status().map_err(|e| format!("unshare(CLONE_NEWUSER|CLONE_NEWNS|CLONE_NEWPID|CLONE_NEWNET): {e}"))?;
    if status.success() { Ok("in a forked child ") } else { Err(format!("probe child {status}")) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::report::Status;

    #[test]
    fn root_needs_uid_0_and_cap_sys_admin() {
        let ok = root_from_status("Uid:\t0\t0\t0\t0\nCapEff:\t000001ffffffffff\n");
        assert_eq!(ok.status, Status::Ok);
        let no_cap = root_from_status("Uid:\t0\t0\t0\t0\nCapEff:\t0000000000000000\n");
        assert_eq!(no_cap.status, Status::Fail);
        let user = root_from_status("Uid:\t1000\t1000\t1000\t1000\nCapEff:\t0000000000000000\n");
        assert_eq!(user.status, Status::Fail);
        assert!(user.detail.contains("1000"));
        assert!(user.fix.is_some());
    }

    #[test]
    fn forked_child_can_create_a_user_namespace_when_root() {
        let status = fs::read_to_string(host::PROC_SELF_STATUS).unwrap_or_default();
        if host::effective_uid(&status) != Some(0) {
            return;
        }
        assert_eq!(create_in_forked_child(), Ok("in a forked child "));
    }
}
