//! Idmapped template layers for build sandboxes: a build step may change what an earlier layer holds.
//!
//! Layer files are owned by the host's root, which a sandbox's user namespace does not map: inside, they are the
//! overflow user's, readable and never writable. A build sandbox's overlay instead gets each lower layer as an
//! idmapped mount (`mount_setattr(MOUNT_ATTR_IDMAP)`) through a user namespace that maps the layers' owner (host 0)
//! to the host ids of the sandbox's user, so inside they are the build user's own and overlay's copy-up lets a step
//! change or delete them (the change lands in the step's capture, as every write does; the layer on the host stays
//! as it was: each idmapped mount is read-only, nosuid, nodev and private, so nothing propagates to or from the
//! host's mounts, and it is reachable only before the pivot, as the overlay's lower).
//!
//! Only the host's root can idmap a mount of the host's filesystem (it needs `CAP_SYS_ADMIN` over the filesystem's
//! user namespace), so the host makes them as detached mounts (`open_tree(OPEN_TREE_CLONE)`) before the clone and
//! sends them to the sandbox's agent over its channel (a count, then the descriptors, `SCM_RIGHTS`); the agent
//! attaches each over its layer's path in its own private mount namespace (`move_mount`) just before it mounts the
//! overlay. Nothing is mounted on the host, and the mounts end with the sandbox's mount namespace.

#![allow(unsafe_code)]

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use rustix::mount::{MoveMountFlags, OpenTreeFlags};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags,
};

use crate::error::{JailError, last_os_error};

/// Most descriptors in one message (the kernel's `SCM_MAX_FD` is 253).
const FDS_PER_MESSAGE: usize = 250;

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `MOUNT_ATTR_RDONLY`, `MOUNT_ATTR_NOSUID`, `MOUNT_ATTR_NODEV` and `MOUNT_ATTR_IDMAP` of `<linux/mount.h>`.
const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;
const MOUNT_ATTR_NOSUID: u64 = 0x0000_0002;
const MOUNT_ATTR_NODEV: u64 = 0x0000_0004;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

fn failed(what: &str, source: io::Error) -> JailError {
    JailError::Idmap { what: what.to_owned(), source }
}

/// A user namespace mapping id 0 (users and groups) to the host's `uid` and `gid`, and nothing else: the idmapping
/// of a build sandbox's layers. Made by a short-lived child (a user namespace lives on through the returned
/// descriptor after its last process ends). The child only closes, reads and `_exit`s (all async-signal-safe).
pub fn owner_mapping(uid: u32, gid: u32) -> Result<OwnedFd, JailError> {
    let (wait_read, wait_write) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| failed("pipe", e.into()))?;
    let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong;
    // SAFETY: raw clone without CLONE_VM and with a null stack behaves like fork(2). The child only calls close(2),
    // read(2) and _exit(2), all async-signal-safe, so it never touches a lock another thread of the caller held.
    let pid = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    if pid == 0 {
        let mut byte = [0u8; 1];
        let read_end = wait_read.as_raw_fd() as libc::c_uint;
        // SAFETY: closes every descriptor this child inherited but the pipe's read end (the write end among them,
        // else the read below never sees the end of the pipe; other sandboxes' channels, which it must not hold),
        // reads into a local buffer from that pipe, then _exits without destructors. Integers and a local buffer.
        unsafe {
            if read_end > 0 {
                libc::syscall(libc::SYS_close_range, 0, read_end - 1, 0);
            }
            libc::syscall(libc::SYS_close_range, read_end + 1, libc::c_uint::MAX, 0);
            libc::read(read_end as libc::c_int, byte.as_mut_ptr().cast(), 1);
            libc::_exit(0)
        }
    }
    if pid < 0 {
        return Err(failed("clone of the idmapping's user namespace", last_os_error()));
    }
    drop(wait_read);
    let made = (|| {
        let write = |file: &str, text: String| {
            std::fs::write(format!("/proc/{pid}/{file}"), text).map_err(|e| failed(&format!("writing {file}"), e))
        };
        write("uid_map", format!("0 {uid} 1\n"))?;
        write("setgroups", "deny".to_owned())?;
        write("gid_map", format!("0 {gid} 1\n"))?;
        std::fs::File::open(format!("/proc/{pid}/ns/user"))
            .map(OwnedFd::from)
            .map_err(|e| failed("opening the user namespace", e))
    })();
    drop(wait_write);
    let mut status = 0;
    // SAFETY: waits for the child cloned above, which ends as soon as its pipe closes; retried when interrupted.
    while unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) } < 0
        && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
    {}
    made
}

/// A detached, read-only, private mount of the directory `path` (not the mounts beneath it: an overlay's lower
/// never crosses into them) whose files' ids are seen through `mapping` (`owner_mapping`): the host's root's files
/// are the mapped user's. Must run as the host's root.
pub fn idmapped(path: &Path, mapping: BorrowedFd<'_>) -> Result<OwnedFd, JailError> {
    let tree = rustix::mount::open_tree(
        rustix::fs::CWD,
        path,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC | OpenTreeFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(|e| failed(&format!("open_tree of {}", path.display()), e.into()))?;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        attr_clr: 0,
        // Out of the host's peer group: nothing mounted beneath it inside would show on the host, nor the reverse.
        propagation: libc::MS_PRIVATE,
        userns_fd: mapping.as_raw_fd() as u64,
    };
    // SAFETY: mount_setattr on a descriptor we own, with an empty path (AT_EMPTY_PATH), a valid `struct mount_attr`
    // and its size; the kernel reads the struct during the call only.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if ret != 0 {
        return Err(failed(
            &format!("idmapping {} (needs Linux 5.12+ and a filesystem that supports idmapped mounts)", path.display()),
            last_os_error(),
        ));
    }
    Ok(tree)
}

/// Attaches the detached mount `tree` at `target` in this process's mount namespace.
pub fn attach(tree: OwnedFd, target: &Path) -> Result<(), JailError> {
    rustix::mount::move_mount(tree.as_fd(), "", rustix::fs::CWD, target, MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
        .map_err(|e| JailError::Mount {
            what: "an idmapped layer".to_owned(),
            target: target.to_path_buf(),
            source: e.into(),
        })
}

/// Sends `fds` over `channel`: their count (4 bytes, little-endian), then the descriptors, at most
/// `FDS_PER_MESSAGE` per one-byte message.
pub fn send_fds(channel: &UnixStream, fds: &[OwnedFd]) -> Result<(), JailError> {
    let count = u32::try_from(fds.len()).map_err(|_| failed("sending layer mounts", io::Error::other("too many")))?;
    let mut stream = channel;
    std::io::Write::write_all(&mut stream, &count.to_le_bytes()).map_err(|e| failed("sending layer mounts", e))?;
    for chunk in fds.chunks(FDS_PER_MESSAGE) {
        let borrowed: Vec<BorrowedFd<'_>> = chunk.iter().map(AsFd::as_fd).collect();
        let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_PER_MESSAGE))];
        let mut buffer = SendAncillaryBuffer::new(&mut space);
        if !buffer.push(SendAncillaryMessage::ScmRights(&borrowed)) {
            return Err(failed("sending layer mounts", io::Error::other("ancillary buffer too small")));
        }
        rustix::net::sendmsg(channel, &[IoSlice::new(b"m")], &mut buffer, SendFlags::NOSIGNAL)
            .map_err(|e| failed("sending layer mounts", e.into()))?;
    }
    Ok(())
}

/// Receives the descriptors that `send_fds` sent over `channel` (close-on-exec), failing unless they are
/// `expected` many (or none, when `optional`).
pub fn receive_fds(channel: &UnixStream, expected: usize, optional: bool) -> Result<Vec<OwnedFd>, JailError> {
    let mut count = [0u8; 4];
    let mut stream = channel;
    std::io::Read::read_exact(&mut stream, &mut count).map_err(|e| failed("receiving layer mounts", e))?;
    let count = u32::from_le_bytes(count) as usize;
    if count != expected && !(optional && count == 0) {
        return Err(failed(
            "receiving layer mounts",
            io::Error::other(format!("the host sent {count} layer mounts, the plan has {expected} lower layers")),
        ));
    }
    let mut fds = Vec::with_capacity(count);
    while fds.len() < count {
        let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_PER_MESSAGE))];
        let mut buffer = RecvAncillaryBuffer::new(&mut space);
        let mut byte = [0u8; 1];
        let received =
            rustix::net::recvmsg(channel, &mut [IoSliceMut::new(&mut byte)], &mut buffer, RecvFlags::CMSG_CLOEXEC)
                .map_err(|e| failed("receiving layer mounts", e.into()))?;
        if received.bytes == 0 {
            return Err(failed("receiving layer mounts", io::Error::from(io::ErrorKind::UnexpectedEof)));
        }
        if received.flags.contains(ReturnFlags::CTRUNC) {
            return Err(failed(
                "receiving layer mounts",
                io::Error::other("descriptors were dropped (the agent's descriptor limit?)"),
            ));
        }
        let before = fds.len();
        for message in buffer.drain() {
            if let RecvAncillaryMessage::ScmRights(rights) = message {
                fds.extend(rights);
            }
        }
        if fds.len() == before {
            return Err(failed("receiving layer mounts", io::Error::other("a message without descriptors")));
        }
    }
    if fds.len() != count {
        return Err(failed(
            "receiving layer mounts",
            io::Error::other(format!("{} descriptors where {count} were announced", fds.len())),
        ));
    }
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An idmapped layer mount as a build sandbox's agent attaches it: read-only, nosuid, nodev, out of the peer
    /// group of the (shared) mount it was cloned from, and the host root's files are the mapped user's through it.
    #[test]
    fn an_idmapped_layer_is_read_only_private_and_owned_by_the_mapped_user() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: idmapped mounts need root");
            return;
        }
        // This test's thread gets a mount namespace of its own (nextest runs each test in a process of its own).
        // SAFETY: a new mount namespace for this thread only; it shares no memory with anything it invalidates.
        unsafe {
            rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS | rustix::thread::UnshareFlags::FS)
        }
        .unwrap_or_else(|e| panic!("unshare: {e}"));
        let mount = |source: &str, target: &Path, fstype: &str, flags: libc::c_ulong| {
            let c = |text: &str| std::ffi::CString::new(text).unwrap_or_else(|e| panic!("{e}"));
            let (source, target, fstype) = (c(source), c(&target.to_string_lossy()), c(fstype));
            // SAFETY: NUL-terminated strings that outlive the call; no data argument.
            let ret =
                unsafe { libc::mount(source.as_ptr(), target.as_ptr(), fstype.as_ptr(), flags, std::ptr::null()) };
            assert_eq!(ret, 0, "mount: {}", io::Error::last_os_error());
        };
        mount("none", Path::new("/"), "", libc::MS_REC | libc::MS_PRIVATE);
        let base =
            tempfile::Builder::new().prefix("sk-idmap-test-").tempdir_in("/var/tmp").unwrap_or_else(|e| panic!("{e}"));
        let shared = base.path().join("shared");
        let target = base.path().join("target");
        std::fs::create_dir_all(&shared).unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir_all(&target).unwrap_or_else(|e| panic!("{e}"));
        mount("tmpfs", &shared, "tmpfs", 0);
        mount("none", &shared, "", libc::MS_SHARED);
        std::fs::create_dir(shared.join("layer")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(shared.join("layer/file"), "layer").unwrap_or_else(|e| panic!("{e}"));

        let mapping = owner_mapping(4242, 4343).unwrap_or_else(|e| panic!("{e}"));
        let tree = idmapped(&shared.join("layer"), mapping.as_fd()).unwrap_or_else(|e| panic!("{e}"));
        attach(tree, &target).unwrap_or_else(|e| panic!("{e}"));

        let meta = std::fs::metadata(target.join("file")).unwrap_or_else(|e| panic!("{e}"));
        use std::os::unix::fs::MetadataExt;
        assert_eq!((meta.uid(), meta.gid()), (4242, 4343), "the host root's file is the mapped user's");
        let write = std::fs::write(target.join("file"), "changed");
        assert_eq!(write.err().and_then(|e| e.raw_os_error()), Some(libc::EROFS), "the layer mount is read-only");
        let flags = rustix::fs::statvfs(&target).unwrap_or_else(|e| panic!("{e}")).f_flag;
        use rustix::fs::StatVfsMountFlags as F;
        assert!(flags.contains(F::RDONLY | F::NOSUID | F::NODEV), "{flags:?}");
        // Out of the shared mount's peer group: a mount beneath the attached tree does not show in the source.
        std::fs::create_dir(shared.join("layer/sub")).unwrap_or_else(|e| panic!("{e}"));
        mount("tmpfs", &target.join("sub"), "tmpfs", 0);
        std::fs::write(target.join("sub/beneath"), "x").unwrap_or_else(|e| panic!("{e}"));
        assert!(!shared.join("layer/sub/beneath").exists(), "a mount beneath the layer mount propagated to its source");
        let _ = rustix::mount::unmount(target.join("sub").as_path(), rustix::mount::UnmountFlags::DETACH);
        assert_eq!(std::fs::read_to_string(shared.join("file")).ok(), None);
        assert_eq!(std::fs::read_to_string(shared.join("layer/file")).ok().as_deref(), Some("layer"));
        for dir in [&target, &shared] {
            let _ = rustix::mount::unmount(dir.as_path(), rustix::mount::UnmountFlags::DETACH);
        }
    }

    #[test]
    fn descriptors_cross_a_channel_in_chunks() {
        let (host, agent) = UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
        let files: Vec<OwnedFd> = (0..300)
            .map(|_| OwnedFd::from(std::fs::File::open("/dev/null").unwrap_or_else(|e| panic!("{e}"))))
            .collect();
        send_fds(&host, &files).unwrap_or_else(|e| panic!("{e}"));
        let received = receive_fds(&agent, 300, false).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(received.len(), 300);
        let sent = |fds: &[OwnedFd], expected: usize, optional: bool| {
            let (host, agent) = UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
            send_fds(&host, fds).unwrap_or_else(|e| panic!("{e}"));
            receive_fds(&agent, expected, optional).map(|fds| fds.len()).map_err(|e| e.to_string())
        };
        for optional in [false, true] {
            let mismatch = sent(&files[..2], 3, optional).err().unwrap_or_default();
            assert!(mismatch.contains("the host sent 2 layer mounts, the plan has 3"), "{mismatch}");
        }
        // None instead of all: refused for a build sandbox, taken for one that only reads its layers.
        assert!(sent(&[], 3, false).is_err());
        assert_eq!(sent(&[], 3, true), Ok(0));
        let flags = rustix::io::fcntl_getfd(&received[299]).unwrap_or_else(|e| panic!("{e}"));
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC), "received descriptors are close-on-exec");
    }
}
