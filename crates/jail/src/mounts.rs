//! Carrying out a root filesystem plan (`rootfs::MountStep`) and pivoting into it. Runs in the sandbox's init, as
//! root of its user namespace, inside its private mount namespace: nothing here is visible on the host.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{JailError, last_os_error};
use crate::rootfs::{BindKind, MountStep, SandboxFile};

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
pub fn execute(steps: &[MountStep], sandbox_uid: u32, sandbox_gid: u32) -> Result<(), JailError> {
    for step in steps {
        execute_step(step, sandbox_uid, sandbox_gid)?;
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
        MountStep::BindReadOnly { source, target, kind } => {
            create_mount_point(target, *kind)?;
            sys_mount(&source.to_string_lossy(), target, "", libc::MS_BIND | libc::MS_REC, "")?;
            remount_read_only(target, libc::MS_NOSUID | libc::MS_NODEV)
        }
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
