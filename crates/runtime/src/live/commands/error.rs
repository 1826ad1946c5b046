//! The failures of background-command operations, each a `Failure` of the kind the API answers with.

use sandkasten_types::{Failure, FailureKind};

/// No such command in this sandbox (never started, or forgotten).
pub(super) fn not_found(id: &str) -> Failure {
    Failure::new(FailureKind::NotFound, format!("no command {id} in this sandbox"))
}

/// The command has ended: it takes no more stdin or signals.
pub(super) fn ended(id: &str) -> Failure {
    Failure::new(FailureKind::Conflict, format!("command {id} has ended"))
}

/// The command's stdin was closed before.
pub(super) fn stdin_closed(id: &str) -> Failure {
    Failure::new(FailureKind::Conflict, format!("the stdin of command {id} is closed"))
}

/// The sandbox runs as many background commands as it may.
pub(super) fn too_many(most: usize) -> Failure {
    Failure::new(
        FailureKind::Conflict,
        format!("a sandbox runs at most {most} background commands at once; wait for one to end or kill one"),
    )
}

/// The command id is taken (the server chooses fresh ids: this is its fault, not the client's).
pub(super) fn duplicate(id: &str) -> Failure {
    Failure::new(FailureKind::Internal, format!("command {id} exists already"))
}
