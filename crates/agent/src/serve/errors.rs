//! Errors of the serve loop: `ServeError` ends the loop (the transport or the kernel failed), `OpError` fails one
//! request and becomes a `Failed` reply.

use rustix::io::Errno;
use sandkasten_protocol::{FailureCode, Message, ProtocolError};
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

/// Why one request failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct OpError {
    /// Machine-readable reason.
    pub code: FailureCode,
    /// For humans.
    pub message: String,
}

impl OpError {
    /// An error with an explicit code.
    pub fn new(code: FailureCode, message: impl Into<String>) -> Self {
        OpError { code, message: message.into() }
    }

    /// A failed system call on `path`, its errno mapped to a failure code.
    pub fn sys(what: &str, path: &str, errno: Errno) -> Self {
        OpError { code: failure_code(errno), message: format!("{what} {path}: {}", std::io::Error::from(errno)) }
    }

    /// The `Failed` reply.
    pub fn into_message(self) -> Message {
        Message::Failed { code: self.code, message: self.message }
    }
}

/// Maps an errno to the protocol's failure code.
pub fn failure_code(errno: Errno) -> FailureCode {
    match errno {
        Errno::NOENT | Errno::SRCH => FailureCode::NotFound,
        Errno::ACCESS | Errno::PERM | Errno::ROFS | Errno::TXTBSY => FailureCode::PermissionDenied,
        Errno::LOOP | Errno::INVAL | Errno::NAMETOOLONG | Errno::XDEV | Errno::NXIO => FailureCode::InvalidPath,
        Errno::EXIST => FailureCode::AlreadyExists,
        Errno::NOTDIR => FailureCode::NotADirectory,
        Errno::ISDIR => FailureCode::IsADirectory,
        Errno::NOTEMPTY => FailureCode::NotEmpty,
        Errno::FBIG | Errno::NOSPC | Errno::DQUOT => FailureCode::TooLarge,
        Errno::BUSY | Errno::AGAIN | Errno::MFILE | Errno::NFILE => FailureCode::Busy,
        _ => FailureCode::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_map_to_the_documented_codes() {
        assert_eq!(failure_code(Errno::NOENT), FailureCode::NotFound);
        assert_eq!(failure_code(Errno::ACCESS), FailureCode::PermissionDenied);
        assert_eq!(failure_code(Errno::LOOP), FailureCode::InvalidPath);
        assert_eq!(failure_code(Errno::NOTEMPTY), FailureCode::NotEmpty);
        assert_eq!(failure_code(Errno::NOSPC), FailureCode::TooLarge);
        assert_eq!(failure_code(Errno::IO), FailureCode::Internal);
    }
}
