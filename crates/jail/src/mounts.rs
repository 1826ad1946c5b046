//! Carrying out a root filesystem plan (`rootfs::MountStep`) and pivoting into it. Runs in the sandbox's init, as
//! root of its user namespace, inside its private mount namespace: nothing here is visible on the host.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{JailError, last_os_error};
use crate::rootfs::{BindKind, COPY_MAX_BYTES, MountStep, SandboxFile};

/// Calls mount(2). `source`, `fstype` and `data` may be empty to pass NULL.
fn sys_mount(source: &str, target: &Path, fstype: &str, flags: u64, data: &str) -> Result<(), JailError> {
    let fail = |source_error: io::Error| JailError::Mount {
        what: if fstype.is_empty() { source.to_owned() } else { fstype.to_owned() },
        target: target.to_path_buf(),
        source: source_error,
    };
    let nul = |_| fail(io::Error::from(io::ErrorKind::InvalidInput));
    let source_c = CString::new(source).map_err(nul)?;
    let target_c = CString::new(target.as_os_str().as_encoded_bytes()).map_err(nul)?;
    let fstype_c = CString::new(fstype).map_err(nul)?;
    let data_c = CString::new(data).map_err(nul)?;
    let opt = |value: &CString, text: &str| if text.is_empty() { std::ptr::null() } else { value.as_ptr() };
    // SAFETY: every pointer is either null or points to a NUL-terminated string that outlives the call.
    let ret = unsafe {
        libc::mount(
            opt(&source_c, source),
            target_c.as_ptr(),
            opt(&fstype_c, fstype),
            flags as libc::c_ulong,
            opt(&data_c, data).cast(),
        )
    };
    if ret != 0 {
        return Err(fail(last_os_error()));
    }
    Ok(())
}

/// The flags of the mount at `path` that the kernel locks in a user namespace (nosuid, nodev, noexec, atime), which a
/// remount must repeat or it fails with EPERM.
fn locked_flags(path: &Path) -> Result<u64, JailError> {
    let stat = rustix::fs::statvfs(path).map_err(|e| JailError::Mount {
        what: "statvfs".into(),
        target: path.to_path_buf(),
        source: e.into(),
    })?;
    let flags = stat.f_flag;
    let mut locked = 0u64;
    for (st, ms) in [
        (rustix::fs::StatVfsMountFlags::NOSUID, libc::MS_NOSUID),
        (rustix::fs::StatVfsMountFlags::NODEV, libc::MS_NODEV),
        (rustix::fs::StatVfsMountFlags::NOEXEC, libc::MS_NOEXEC),
        (rustix::fs::StatVfsMountFlags::NOATIME, libc::MS_NOATIME),
        (rustix::fs::StatVfsMountFlags::NODIRATIME, libc::MS_NODIRATIME),
        (rustix::fs::StatVfsMountFlags::RELATIME, libc::MS_RELATIME),
    ] {
        if flags.contains(st) {
            locked |= ms;
        }
    }
    Ok(locked)
}

fn remount_read_only(target: &Path, extra: u64) -> Result<(), JailError> {
    let flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | locked_flags(target)? | extra;
    sys_mount("", target, "", flags, "")
}

fn create_dir_all(path: &Path) -> Result<(), JailError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path)
        .map_err(|source| JailError::CreatePath { path: path.to_path_buf(), source })
}

fn create_mount_point(path: &Path, kind: BindKind) -> Result<(), JailError> {
    match kind {
        BindKind::Dir => create_dir_all(path),
        BindKind::File => {
            if let Some(parent) = path.parent() {
                create_dir_all(parent)?;
            }
            fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(path)
                .map(drop)
                .map_err(|source| JailError::CreatePath { path: path.to_path_buf(), source })
        }
    }
}

fn write_file(file: &SandboxFile, uid: u32, gid: u32) -> Result<(), JailError> {
    let fail = |source| JailError::CreatePath { path: file.path.clone(), source };
    let owner = |path: &Path| -> Result<(), JailError> {
        if file.owned_by_sandbox_user {
            std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(fail)?;
        }
        Ok(())
    };
    if let Some(parent) = file.path.parent()
        && !parent.exists()
    {
        create_dir_all(parent)?;
        owner(parent)?;
    }
    fs::write(&file.path, &file.contents).map_err(fail)?;
    fs::set_permissions(&file.path, fs::Permissions::from_mode(file.mode)).map_err(fail)?;
    owner(&file.path)
}

/// Writes files into the (already pivoted) sandbox, e.g. uploads into `/workspace`; parents are created as needed.
pub fn write_files(files: &[SandboxFile], sandbox_uid: u32, sandbox_gid: u32) -> Result<(), JailError> {
    files.iter().try_for_each(|file| write_file(file, sandbox_uid, sandbox_gid))
}

/// Carries out the steps in order. `sandbox_uid`/`sandbox_gid` own the files marked as the sandbox user's.
/// `layer_mounts`: a build sandbox's idmapped lower layers (`idmap`), one per lower of its `TemplateOverlay`, in
/// the same order; empty for every other sandbox.
pub fn execute(
    steps: &[MountStep],
    sandbox_uid: u32,
    sandbox_gid: u32,
    layer_mounts: Vec<std::os::fd::OwnedFd>,
) -> Result<(), JailError> {
    let mut layer_mounts = Some(layer_mounts);
    for step in steps {
        if let MountStep::TemplateOverlay { lowers, .. } = step {
            attach_layer_mounts(lowers, layer_mounts.take().unwrap_or_default())?;
        }
        execute_step(step, sandbox_uid, sandbox_gid)?;
    }
    match layer_mounts {
        Some(left) if !left.is_empty() => Err(JailError::Idmap {
            what: "attaching layer mounts".to_owned(),
            source: io::Error::other("the plan mounts no template layers"),
        }),
        _ => Ok(()),
    }
}

/// Attaches each idmapped layer mount (private, read-only: `idmap::idmapped`) over its lower's path in this mount
/// namespace, so the overlay mounted next reads the layers through them.
fn attach_layer_mounts(lowers: &[PathBuf], mounts: Vec<std::os::fd::OwnedFd>) -> Result<(), JailError> {
    if mounts.is_empty() {
        return Ok(());
    }
    if mounts.len() != lowers.len() {
        return Err(JailError::Idmap {
            what: "attaching layer mounts".to_owned(),
            source: io::Error::other(format!("{} mounts for {} layers", mounts.len(), lowers.len())),
        });
    }
    for (tree, lower) in mounts.into_iter().zip(lowers) {
        crate::idmap::attach(tree, lower)?;
    }
    Ok(())
}

fn execute_step(step: &MountStep, uid: u32, gid: u32) -> Result<(), JailError> {
    match step {
        MountStep::MakeEverythingPrivate => sys_mount("", Path::new("/"), "", libc::MS_REC | libc::MS_PRIVATE, ""),
        MountStep::Tmpfs { target, options, flags } => {
            create_dir_all(target)?;
            sys_mount("tmpfs", target, "tmpfs", *flags, options)
        }
        MountStep::OverlayReadOnly { source, target } => overlay_read_only(source, target),
        MountStep::TemplateOverlay { target, lowers, capture } => template_overlay(target, lowers, capture.as_deref()),
        MountStep::CopyReadOnly { source, target } => copy_read_only(source, target),
        MountStep::BindDevice { source, target } => {
            create_mount_point(target, BindKind::File)?;
            sys_mount(&source.to_string_lossy(), target, "", libc::MS_BIND, "")
        }
        MountStep::Mkdir { path, mode } => fs::DirBuilder::new()
            .recursive(true)
            .mode(*mode)
            .create(path)
            .map_err(|source| JailError::CreatePath { path: path.clone(), source }),
        MountStep::Symlink { link, points_to } => {
            if let Some(parent) = link.parent() {
                create_dir_all(parent)?;
            }
            std::os::unix::fs::symlink(points_to, link)
                .map_err(|source| JailError::CreatePath { path: link.clone(), source })
        }
        MountStep::WriteFile(file) => write_file(file, uid, gid),
        MountStep::Proc { target } => {
            create_dir_all(target)?;
            sys_mount("proc", target, "proc", libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC, "")
        }
        MountStep::MaskFile { target } => {
            if !target.exists() {
                return Ok(());
            }
            sys_mount("/dev/null", target, "", libc::MS_BIND, "")
        }
        MountStep::MaskDir { target } => {
            if !target.is_dir() {
                return Ok(());
            }
            sys_mount(
                "tmpfs",
                target,
                "tmpfs",
                libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                "size=0",
            )
        }
        MountStep::MakeReadOnly { target } => {
            if !target.exists() {
                return Ok(());
            }
            sys_mount(&target.to_string_lossy(), target, "", libc::MS_BIND | libc::MS_REC, "")?;
            remount_read_only(target, libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC)
        }
        MountStep::Devpts { target } => {
            create_dir_all(target)?;
            sys_mount("devpts", target, "devpts", libc::MS_NOSUID | libc::MS_NOEXEC, crate::rootfs::DEVPTS_OPTIONS)
        }
        MountStep::RemountReadOnly { target } => remount_read_only(target, 0),
    }
}

/// Binds the host path `source` at `target` read-only (keeping the source mount's locked flags), with the mounts
/// beneath it.
fn bind_read_only(source: &Path, target: &Path, kind: BindKind) -> Result<(), JailError> {
    create_mount_point(target, kind)?;
    sys_mount(&source.to_string_lossy(), target, "", libc::MS_BIND | libc::MS_REC, "")?;
    remount_read_only(target, libc::MS_NOSUID | libc::MS_NODEV)
}

/// See `MountStep::OverlayReadOnly`. Overlay options separate layers with `:` and options with `,`: a path holding
/// either (or `\\`) is bound instead of being quoted.
fn overlay_read_only(source: &Path, target: &Path) -> Result<(), JailError> {
    create_dir_all(target)?;
    let (lower, empty) = (source.to_string_lossy(), target.to_string_lossy());
    let plain = |path: &str| !path.contains([':', ',', '\\']);
    let options = format!("lowerdir={lower}:{empty}");
    let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
    if !plain(&lower) || !plain(&empty) || sys_mount("overlay", target, "overlay", flags, &options).is_err() {
        return bind_read_only(source, target, BindKind::Dir);
    }
    for beneath in top_mounts_beneath(source)? {
        let Ok(relative) = beneath.strip_prefix(source) else { continue };
        bind_read_only(&beneath, &target.join(relative), BindKind::Dir)?;
    }
    Ok(())
}

/// See `MountStep::TemplateOverlay`. A path holding `:`, `,` or `\\` cannot be named in overlay options and fails.
fn template_overlay(target: &Path, lowers: &[PathBuf], capture: Option<&Path>) -> Result<(), JailError> {
    create_dir_all(target)?;
    let unnameable = |path: PathBuf| JailError::CreatePath {
        path,
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "an overlay layer path with ':', ',' or '\\'"),
    };
    let mut options = crate::rootfs::read_only_overlay_options(lowers, target).map_err(unnameable)?;
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
    match capture {
        Some(capture) => {
            let (upper, work) = (capture.join("upper/opt"), capture.join("work"));
            if let Some(bad) = [&upper, &work].into_iter().find(|p| p.to_string_lossy().contains([':', ',', '\\'])) {
                return Err(unnameable(bad.clone()));
            }
            options.push_str(&format!(",upperdir={},workdir={}", upper.to_string_lossy(), work.to_string_lossy()));
        }
        None => flags |= libc::MS_RDONLY,
    }
    sys_mount("overlay", target, "overlay", flags, &options)
}

/// The mount points strictly beneath `dir` in this mount namespace (`/proc/self/mountinfo`), without those beneath
/// another of them (a recursive bind carries those).
fn top_mounts_beneath(dir: &Path) -> Result<Vec<PathBuf>, JailError> {
    let mountinfo = Path::new("/proc/self/mountinfo");
    let text = fs::read_to_string(mountinfo)
        .map_err(|source| JailError::ReadHost { path: mountinfo.to_path_buf(), source })?;
    let mut points: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|escaped| PathBuf::from(unescape_mountinfo(escaped)))
        .filter(|point| point != dir && point.starts_with(dir))
        .collect();
    points.sort();
    let mut top: Vec<PathBuf> = Vec::new();
    for point in points {
        if !top.iter().any(|above| point.starts_with(above)) {
            top.push(point);
        }
    }
    Ok(top)
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok());
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// See `MountStep::CopyReadOnly`.
fn copy_read_only(source: &Path, target: &Path) -> Result<(), JailError> {
    use std::io::Read;
    let fail = |source| JailError::CreatePath { path: target.to_path_buf(), source };
    let read_fail = |e| JailError::ReadHost { path: source.to_path_buf(), source: e };
    let file = fs::File::open(source).map_err(read_fail)?;
    let meta = file.metadata().map_err(read_fail)?;
    if !meta.is_file() || meta.len() > COPY_MAX_BYTES {
        return bind_read_only(source, target, BindKind::File);
    }
    let mut contents = Vec::new();
    file.take(COPY_MAX_BYTES).read_to_end(&mut contents).map_err(read_fail)?;
    if let Some(parent) = target.parent() {
        create_dir_all(parent)?;
    }
    fs::write(target, &contents).map_err(fail)?;
    fs::set_permissions(target, fs::Permissions::from_mode(0o444)).map_err(fail)
}

/// Makes `new_root` the root of the mount namespace and detaches the old root entirely, so no host path remains
/// reachable. Uses the `pivot_root(".", ".")` idiom: no directory for the old root is needed in the (read-only) new
/// root.
pub fn pivot_into(new_root: &Path) -> Result<(), JailError> {
    let chdir = |path: &Path| {
        rustix::process::chdir(path).map_err(|e| JailError::Chdir { path: path.to_path_buf(), source: e.into() })
    };
    chdir(new_root)?;
    rustix::process::pivot_root(".", ".").map_err(|e| JailError::PivotRoot(e.into()))?;
    rustix::mount::unmount(".", rustix::mount::UnmountFlags::DETACH)
        .map_err(|e| JailError::UnmountOldRoot(e.into()))?;
    chdir(&PathBuf::from("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_mountinfo("/usr/my\\040dir"), "/usr/my dir");
        assert_eq!(unescape_mountinfo("/a\\134b\\011c"), "/a\\b\tc");
        assert_eq!(unescape_mountinfo("/plain\\x"), "/plain\\x");
    }

    /// Runs `check` in a forked child in a mount namespace of its own (nothing it mounts is seen outside) and
    /// returns its exit code.
    fn in_private_mount_namespace(check: impl FnOnce() -> i32) -> i32 {
        // SAFETY: the child only calls async-signal-tolerant code of this test and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: unshare with a flag constant; no pointers.
            let code = if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0
                || execute_step(&MountStep::MakeEverythingPrivate, 0, 0).is_err()
            {
                100
            } else {
                check()
            };
            // SAFETY: leave the forked child without running any of the parent's code.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child with a valid status pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "child died: status {status:#x}");
        libc::WEXITSTATUS(status)
    }

    #[test]
    fn an_overlay_of_a_host_directory_is_read_only_and_carries_the_mounts_beneath_it() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: mounting needs root");
            return;
        }
        let base = std::env::temp_dir().join(format!("sandkasten-overlay-test-{}", std::process::id()));
        let (source, target) = (base.join("source"), base.join("target"));
        fs::create_dir_all(source.join("beneath")).unwrap_or_default();
        fs::write(source.join("top.txt"), "top").unwrap_or_default();
        let code = in_private_mount_namespace(|| {
            let beneath = source.join("beneath");
            if sys_mount("tmpfs", &beneath, "tmpfs", 0, "size=1m").is_err()
                || fs::write(beneath.join("inner.txt"), "inner").is_err()
            {
                return 101;
            }
            if overlay_read_only(&source, &target).is_err() {
                return 102;
            }
            let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            let overlay = mounts.lines().any(|l| l.contains(" - overlay ") && l.contains(&*target.to_string_lossy()));
            match (
                overlay,
                fs::read_to_string(target.join("top.txt")).ok().as_deref(),
                fs::read_to_string(target.join("beneath/inner.txt")).ok().as_deref(),
                fs::write(target.join("new.txt"), "x").map_err(|e| e.raw_os_error()),
                fs::write(target.join("beneath/new.txt"), "x").map_err(|e| e.raw_os_error()),
            ) {
                (false, ..) => 103,
                (_, Some("top"), Some("inner"), Err(Some(libc::EROFS)), Err(Some(libc::EROFS))) => 0,
                (_, _, None, ..) => 104,
                _ => 105,
            }
        });
        let _ = fs::remove_dir_all(&base);
        assert_eq!(
            code, 0,
            "100 namespace, 101 setup, 102 overlay, 103 no overlay, 104 mount beneath lost, 105 writable"
        );
    }
}
