//! Network namespace setup: the sandbox's own namespace starts with only `lo`, down; bring it up.

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
