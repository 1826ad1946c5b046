//! The failures of code-context operations, each a `Failure` of the kind the API answers with: a context that
//! cannot be made or used is `ExecFailed` (like a command that cannot start).

use sandkasten_types::{Failure, FailureKind};

/// No such context in this sandbox.
pub(super) fn not_found(id: &str) -> Failure {
    Failure::new(FailureKind::NotFound, format!("no code context {id} in this sandbox"))
}

/// The sandbox has as many contexts as it may.
pub(super) fn too_many(most: usize) -> Failure {
    Failure::new(FailureKind::ExecFailed, format!("a sandbox may have at most {most} code contexts; remove one first"))
}

/// The cell's language is not the context's.
pub(super) fn language_mismatch(id: &str, actual: &str, requested: &str) -> Failure {
    Failure::new(FailureKind::ExecFailed, format!("context {id} runs {actual}, not {requested}"))
}

/// The interpreter could not be started.
pub(super) fn start_failed(message: String) -> Failure {
    Failure::new(FailureKind::ExecFailed, message)
}

/// No random bytes for an id.
pub(super) fn no_id(why: impl std::fmt::Display) -> Failure {
    Failure::new(FailureKind::Internal, format!("cannot make a context id: {why}"))
}

/// A context's working directory that its kernel cannot start in.
pub(super) fn cwd_unusable(kind: FailureKind, dir: &str, why: &str) -> Failure {
    Failure::new(kind, format!("the context's working directory {dir} {why}"))
}
