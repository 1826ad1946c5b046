//! Network namespace setup: the sandbox's own namespace starts with only `lo`, down; bring it up, and size its TCP
//! socket buffers conservatively.

#![allow(unsafe_code)]

use crate::error::{JailError, last_os_error};

/// Brings up the loopback interface of the current network namespace.
pub fn bring_up_loopback() -> Result<(), JailError> {
    // SAFETY: socket(2) with constant arguments; the returned fd is closed below on every path.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(JailError::Loopback(last_os_error()));
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo\0") {
        *slot = *byte as libc::c_char;
    }
    request.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_LOOPBACK | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads a valid, initialised ifreq that outlives the call.
    let ret = unsafe { libc::ioctl(fd, libc::SIOCSIFFLAGS, &request) };
    let error = last_os_error();
    // SAFETY: fd was returned by socket above and is not used after this.
    unsafe { libc::close(fd) };
    if ret != 0 {
        return Err(JailError::Loopback(error));
    }
    Ok(())
}

/// TCP buffer sizes (min, default, max bytes) of the sandbox's own network namespace. These two sysctls are per
/// namespace and writable by the namespace's owner, so the host's stay as they are; a socket inside may queue at most
/// 1 MiB each way instead of the host's maximum (32 MiB of receive buffer on Debian). What the buffers hold is charged
/// to the sandbox's memory limit as well (cgroup v1: `memory.kmem.tcp.limit_in_bytes`; v2: `memory.max`).
pub const TCP_BUFFER_SYSCTLS: [(&str, &str); 2] =
    [("/proc/sys/net/ipv4/tcp_rmem", "4096 131072 1048576"), ("/proc/sys/net/ipv4/tcp_wmem", "4096 16384 1048576")];

/// Writes `TCP_BUFFER_SYSCTLS` for the current network namespace (`/proc/sys/net` is the opener's namespace's). A
/// kernel without the per-namespace sysctls keeps its own sizes: the memory limit still bounds what they hold.
pub fn limit_tcp_buffers() {
    for (path, value) in TCP_BUFFER_SYSCTLS {
        let _ = std::fs::write(path, value);
    }
}
