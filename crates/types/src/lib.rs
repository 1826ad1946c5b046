//! Shared vocabulary of sandkasten: what a sandbox is asked to be (`SandboxSpec`, `Limits`, `NetworkPolicy`), what it is
//! asked to run (`ExecRequest`), and what it answers (`ExecResult`, `PhaseTimings`, `ResourceUsage`, `ErrorInfo`).
//!
//! This crate has no OS dependencies: the CLI, the runtime, the server and the SDK schemas all speak it.

mod background;
mod code;
mod command;
mod error;
mod exec;
mod failure;
mod files;
mod isolation;
mod limits;
mod result;
mod spec;
mod stream;
mod tier;
pub mod units;
mod usage;
pub mod utf8;
mod watch;

pub use background::{CommandEvent, CommandStatus};
pub use code::{CellError, CellOutcome, CellResult, CodeLanguage, CodeRun, ContextInfo};
pub use command::{CommandExit, CommandSpec, CommandUser, PtySize};
pub use error::{ErrorCode, ErrorInfo};
pub use exec::{Command, ExecRequest, Language, Upload};
pub use failure::{Failure, FailureKind};
pub use files::{
    FileInfo, FileKind, FileMetadata, MAX_METADATA_BYTES, MAX_METADATA_KEY_BYTES, METADATA_XATTR_PREFIX, SandboxFile,
    check_metadata,
};
pub use isolation::{CodeNeeds, IoProfile, Isolation, Workload};
pub use limits::{LimitKind, Limits, LimitsError, MAX_PIDS};
pub use result::{ExecResult, OutputStream, PhaseTimings, ResourceUsage, json_forms};
pub use spec::{
    Entrance, HeaderRule, NetworkMode, NetworkPolicy, PROXY_PORT, SandboxSpec, Template, TemplateLayers,
    check_user_name, proxy_environment,
};
pub use stream::{OutputChunk, StreamKind};
pub use tier::{GvisorPlatform, GvisorSettings, MicrovmAccel, MicrovmSettings, Tier};
pub use usage::{DiskUsage, SandboxUsage};
pub use watch::{FsEvent, FsEventKind};
