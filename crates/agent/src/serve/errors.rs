//! Errors of the serve loop: `ServeError` ends the loop (the transport or the kernel failed); a `Failure`
//! (`sandkasten_types`) fails one request and is its `Failed` reply.

use rustix::io::Errno;
use sandkasten_protocol::ProtocolError;
use sandkasten_types::{Failure, FailureKind};
use thiserror::Error;

/// What ends the serve loop with an error.
#[derive(Debug, Error)]
pub enum ServeError {
    /// Blocking SIGCHLD or creating the signalfd failed.
    #[error("signalfd: {0}")]
    Signalfd(std::io::Error),
    /// poll(2) failed.
    #[error("poll: {0}")]
    Poll(Errno),
    /// Configuring the channel failed.
    #[error("channel setup: {0}")]
    Channel(std::io::Error),
    /// The host sent a stream that cannot be resynchronised (a frame over the size limit).
    #[error("protocol: {0}")]
    Protocol(#[from] ProtocolError),
}

/// A failed system call on `path`: its errno mapped to a failure kind (one request fails with it).
pub fn sys_failure(what: &str, path: &str, errno: Errno) -> Failure {
    Failure::new(failure_kind(errno), format!("{what} {path}: {}", std::io::Error::from(errno)))
}

/// Maps an errno to the kind of failure it is. Where the agent cannot do it in this state (busy, out of descriptors),
/// the request conflicts with the sandbox's state: it is not the agent failing.
pub fn failure_kind(errno: Errno) -> FailureKind {
    match errno {
        Errno::NOENT | Errno::SRCH => FailureKind::NotFound,
        Errno::ACCESS | Errno::PERM | Errno::ROFS | Errno::TXTBSY => FailureKind::PermissionDenied,
        Errno::LOOP | Errno::INVAL | Errno::NAMETOOLONG | Errno::XDEV | Errno::NXIO => FailureKind::InvalidPath,
        Errno::EXIST => FailureKind::AlreadyExists,
        Errno::NOTDIR => FailureKind::NotADirectory,
        Errno::ISDIR => FailureKind::IsADirectory,
        Errno::NOTEMPTY => FailureKind::NotEmpty,
        Errno::FBIG | Errno::NOSPC | Errno::DQUOT => FailureKind::TooLarge,
        Errno::BUSY | Errno::AGAIN | Errno::MFILE | Errno::NFILE => FailureKind::Conflict,
        _ => FailureKind::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_map_to_the_documented_kinds() {
        assert_eq!(failure_kind(Errno::NOENT), FailureKind::NotFound);
        assert_eq!(failure_kind(Errno::ACCESS), FailureKind::PermissionDenied);
        assert_eq!(failure_kind(Errno::LOOP), FailureKind::InvalidPath);
        assert_eq!(failure_kind(Errno::NOTEMPTY), FailureKind::NotEmpty);
        assert_eq!(failure_kind(Errno::NOSPC), FailureKind::TooLarge);
        assert_eq!(failure_kind(Errno::IO), FailureKind::Internal);
    }
}
