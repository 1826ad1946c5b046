//! Idmapped template layers for build sandboxes: a build step may change what an earlier layer holds.
//!
//! Layer files are owned by the host's root, which a sandbox's user namespace does not map: inside, they are the
//! overflow user's, readable and never writable. A build sandbox's overlay instead gets each lower layer as an
//! idmapped mount (`mount_setattr(MOUNT_ATTR_IDMAP)`) through a user namespace that maps the layers' owner (host 0)
//! to the host ids of the sandbox's user, so inside they are the build user's own and overlay's copy-up lets a step
//! change or delete them (the change lands in the step's capture, as every write does; the layer on the host stays
//! as it was, and the mount cannot be used to write it: the overlay's lowers are read-only to it).
//!
//! Only the host's root can idmap a mount of the host's filesystem (it needs `CAP_SYS_ADMIN` over the filesystem's
//! user namespace), so the host makes them as detached mounts (`open_tree(OPEN_TREE_CLONE)`) before the clone and
//! sends them to the sandbox's agent over its channel (`SCM_RIGHTS`); the agent attaches each over its layer's path
//! in its own private mount namespace (`move_mount`) just before it mounts the overlay. Nothing is mounted on the
//! host, and the mounts end with the sandbox's mount namespace.

#![allow(unsafe_code)]

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use rustix::mount::{MoveMountFlags, OpenTreeFlags};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
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

/// `MOUNT_ATTR_IDMAP` of `<linux/mount.h>`.
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

fn failed(what: &str, source: io::Error) -> JailError {
    JailError::Idmap { what: what.to_owned(), source }
}

/// A user namespace mapping id 0 (users and groups) to the host's `uid` and `gid`, and nothing else: the idmapping
/// of a build sandbox's layers. Made by a short-lived child (a user namespace lives on through the returned
/// descriptor after its last process ends). The child only closes, reads and `_exit`s (all async-signal-safe).
pub fn owner_mapping(uid: u32, gid: u32) -> Result<OwnedFd, JailError> {
    let (wait_read, wait_write) = rustix::pipe::pipe().map_err(|e| failed("pipe", e.into()))?;
    let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong;
    // SAFETY: raw clone without CLONE_VM and with a null stack behaves like fork(2). The child only calls close(2),
    // read(2) and _exit(2), all async-signal-safe, so it never touches a lock another thread of the caller held.
    let pid = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    if pid == 0 {
        let mut byte = [0u8; 1];
        // SAFETY: closes this child's copy of the write end (else the read below never sees the end of the pipe),
        // reads into a local buffer from the pipe this child inherited, then _exits without destructors.
        unsafe {
            libc::close(wait_write.as_raw_fd());
            libc::read(wait_read.as_raw_fd(), byte.as_mut_ptr().cast(), 1);
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
    // SAFETY: waits for the child cloned above, which ends as soon as its pipe closes.
    unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
    made
}

/// A detached mount of `path` (with the mounts beneath it) whose files' ids are seen through `mapping`
/// (`owner_mapping`): the host's root's files are the mapped user's. Must run as the host's root.
pub fn idmapped(path: &Path, mapping: BorrowedFd<'_>) -> Result<OwnedFd, JailError> {
    let tree = rustix::mount::open_tree(
        rustix::fs::CWD,
        path,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC | OpenTreeFlags::AT_RECURSIVE,
    )
    .map_err(|e| failed(&format!("open_tree of {}", path.display()), e.into()))?;
    let attr =
        MountAttr { attr_set: MOUNT_ATTR_IDMAP, attr_clr: 0, propagation: 0, userns_fd: mapping.as_raw_fd() as u64 };
    // SAFETY: mount_setattr on a descriptor we own, with an empty path (AT_EMPTY_PATH), a valid `struct mount_attr`
    // and its size; the kernel reads the struct during the call only.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
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

/// Sends `fds` over `channel`, at most `FDS_PER_MESSAGE` per one-byte message (none for an empty list).
pub fn send_fds(channel: &UnixStream, fds: &[OwnedFd]) -> Result<(), JailError> {
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

/// Receives `count` descriptors that `send_fds` sent over `channel` (close-on-exec).
pub fn receive_fds(channel: &UnixStream, count: usize) -> Result<Vec<OwnedFd>, JailError> {
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
            io::Error::other(format!("{} descriptors where {count} were expected", fds.len())),
        ));
    }
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_cross_a_channel_in_chunks() {
        let (host, agent) = UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
        let files: Vec<OwnedFd> = (0..300)
            .map(|_| OwnedFd::from(std::fs::File::open("/dev/null").unwrap_or_else(|e| panic!("{e}"))))
            .collect();
        send_fds(&host, &files).unwrap_or_else(|e| panic!("{e}"));
        let received = receive_fds(&agent, 300).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(received.len(), 300);
        let flags = rustix::io::fcntl_getfd(&received[299]).unwrap_or_else(|e| panic!("{e}"));
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC), "received descriptors are close-on-exec");
    }
}
