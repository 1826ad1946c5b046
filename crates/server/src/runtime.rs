//! The seam between the HTTP server and whatever runs sandboxes: the `SandboxRuntime` trait (output arrives as
//! `sandkasten_types::OutputChunk`s, failures are `sandkasten_types::Failure`s). The server only ever talks to a
//! runtime through this trait, so tests plug in an in-memory fake.

use std::future::Future;

use futures::future::BoxFuture;
pub use sandkasten_egress::Entrance;
use sandkasten_types::{
    CellOutcome, CodeLanguage, CodeRun, CommandEvent, CommandExit, CommandSpec, CommandStatus, ContextInfo, Failure,
    FailureKind, FileInfo, OutputChunk, SandboxSpec, Tier,
};
use tokio::sync::mpsc;

/// Runs long-lived sandboxes. Implemented by the real runtime (`crates/runtime`) and by test fakes.
///
/// Ids and paths reaching a runtime are already validated by the server: ids are `sb-` + 16 hex digits, paths are
/// absolute, free of NUL and `..`, at most 4096 bytes. The runtime still confines every path to the sandbox.
pub trait SandboxRuntime: Send + Sync + 'static {
    /// Why sandboxes of `tier` cannot be created on this host, if they cannot: a message for the client (lowercase,
    /// no full stop) that says what to install or configure. The server asks before every create a request makes
    /// (answering 422 `tier_unavailable` with this message) and for the configured tiers (`[defaults]`, each pool's)
    /// when it starts, refusing to start on one answered `Some`. Cheap: it is called on the request path. The
    /// default refuses only what this build cannot run at all (`Tier::unavailable_reason`).
    fn tier_unavailable(&self, tier: Tier) -> Option<String> {
        tier.unavailable_reason().map(str::to_owned)
    }
    /// Creates and starts the sandbox `id` on the tier `spec.isolation` (always set by the server); on failure
    /// nothing of it may remain.
    fn create(&self, id: &str, spec: &SandboxSpec) -> impl Future<Output = Result<(), Failure>> + Send;
    /// Stops the sandbox and removes everything it holds. Destroying an unknown sandbox is `NotFound`.
    fn destroy(&self, id: &str) -> impl Future<Output = Result<(), Failure>> + Send;
    /// True while the sandbox's processes are alive (used by the startup reconcile).
    fn is_alive(&self, id: &str) -> bool;
    /// Runs a command to its end; output chunks are sent to `events` as they arrive (the receiver may be dropped:
    /// keep going). `spec.timeout_ms` is always set by the server.
    fn exec(
        &self,
        id: &str,
        spec: CommandSpec,
        events: mpsc::Sender<OutputChunk>,
    ) -> impl Future<Output = Result<CommandExit, Failure>> + Send;
    /// Reads a whole regular file; `TooLarge` when it is bigger than `max_bytes`.
    fn read_file(&self, id: &str, path: &str, max_bytes: u64) -> impl Future<Output = Result<Vec<u8>, Failure>> + Send;
    /// Creates or replaces a regular file with `data`.
    fn write_file(&self, id: &str, path: &str, data: Vec<u8>) -> impl Future<Output = Result<(), Failure>> + Send;
    /// Lists a directory (not recursive).
    fn list_dir(&self, id: &str, path: &str) -> impl Future<Output = Result<Vec<FileInfo>, Failure>> + Send;
    /// Describes one path without following a final symlink.
    fn stat(&self, id: &str, path: &str) -> impl Future<Output = Result<FileInfo, Failure>> + Send;
    /// Creates a directory, and its missing parents when `parents` is set.
    fn mkdir(&self, id: &str, path: &str, parents: bool) -> impl Future<Output = Result<(), Failure>> + Send;
    /// Renames a path inside the sandbox.
    fn rename(&self, id: &str, from: &str, to: &str) -> impl Future<Output = Result<(), Failure>> + Send;
    /// Removes a file, or a directory (with its contents when `recursive` is set).
    fn remove(&self, id: &str, path: &str, recursive: bool) -> impl Future<Output = Result<(), Failure>> + Send;

    /// Creates a code context (an interpreter whose state persists across cells) and starts it. Runtimes without a
    /// code interpreter keep this default, which refuses.
    fn create_context(
        &self,
        id: &str,
        language: CodeLanguage,
    ) -> impl Future<Output = Result<ContextInfo, Failure>> + Send {
        let _ = (id, language);
        async { Err(no_code_interpreter()) }
    }
    /// Starts a spare interpreter of `language` in the sandbox, with the `preload` modules loaded, which the sandbox's
    /// first code context of that language adopts instead of starting cold (a warm pool member's, made before any
    /// caller has the sandbox). Runtimes without a code interpreter keep this default, which refuses.
    fn prepare_context(
        &self,
        id: &str,
        language: CodeLanguage,
        preload: Vec<String>,
    ) -> impl Future<Output = Result<(), Failure>> + Send {
        let _ = (id, language, preload);
        async { Err(no_code_interpreter()) }
    }
    /// Kills the sandbox's spare interpreters, if any (the sandbox will run no code context: their memory and pids
    /// are the caller's).
    fn discard_prepared_contexts(&self, id: &str) -> impl Future<Output = Result<(), Failure>> + Send {
        let _ = id;
        async { Ok(()) }
    }
    /// The code contexts of a sandbox.
    fn list_contexts(&self, id: &str) -> impl Future<Output = Result<Vec<ContextInfo>, Failure>> + Send {
        let _ = id;
        async { Err(no_code_interpreter()) }
    }
    /// Removes a code context; an unknown context is `NotFound`.
    fn remove_context(&self, id: &str, context: &str) -> impl Future<Output = Result<(), Failure>> + Send {
        let _ = (id, context);
        async { Err(no_code_interpreter()) }
    }
    /// Restarts a code context's interpreter (its state is lost); an unknown context is `NotFound`.
    fn restart_context(&self, id: &str, context: &str) -> impl Future<Output = Result<ContextInfo, Failure>> + Send {
        let _ = (id, context);
        async { Err(no_code_interpreter()) }
    }
    /// Runs one cell in a context (the language's default context when `request.context_id` is `None`); its output
    /// is sent to `events` as it arrives. `request.timeout_ms` is always set by the server.
    fn run_code(
        &self,
        id: &str,
        request: CodeRun,
        events: mpsc::Sender<OutputChunk>,
    ) -> impl Future<Output = Result<CellOutcome, Failure>> + Send {
        let _ = (id, request, events);
        async { Err(no_code_interpreter()) }
    }

    /// Starts a command in the background under `command_id` (chosen by the server) and returns at once. When
    /// `spec.stdin` is set it is written and stdin closed; otherwise stdin stays open for `command_stdin`. Up to
    /// `output_limit` bytes of each output stream are retained for `stream_command`. `spec.timeout_ms` is always set.
    fn start_command(
        &self,
        id: &str,
        command_id: &str,
        spec: CommandSpec,
        output_limit: u64,
    ) -> impl Future<Output = Result<CommandStatus, Failure>> + Send {
        let _ = (id, command_id, spec, output_limit);
        async { Err(no_background_commands()) }
    }
    /// The running and recently ended background commands of a sandbox (a bounded list), oldest first.
    fn list_commands(&self, id: &str) -> impl Future<Output = Result<Vec<CommandStatus>, Failure>> + Send {
        let _ = id;
        async { Err(no_background_commands()) }
    }
    /// A background command's retained output from byte `offset` on, then its live output, then `Ended`; the
    /// stream stops when the receiver is dropped. An unknown command is `NotFound`.
    fn stream_command(
        &self,
        id: &str,
        command_id: &str,
        offset: u64,
    ) -> impl Future<Output = Result<mpsc::Receiver<CommandEvent>, Failure>> + Send {
        let _ = (id, command_id, offset);
        async { Err(no_background_commands()) }
    }
    /// Writes `data` to a background command's stdin and closes it when `eof` is set (`Conflict` once it ended or
    /// its stdin is closed).
    fn command_stdin(
        &self,
        id: &str,
        command_id: &str,
        data: Vec<u8>,
        eof: bool,
    ) -> impl Future<Output = Result<(), Failure>> + Send {
        let _ = (id, command_id, data, eof);
        async { Err(no_background_commands()) }
    }
    /// Sends `signal` to a background command's process group (`Conflict` once it ended, except SIGKILL, which is
    /// then a no-op).
    fn signal_command(
        &self,
        id: &str,
        command_id: &str,
        signal: i32,
    ) -> impl Future<Output = Result<(), Failure>> + Send {
        let _ = (id, command_id, signal);
        async { Err(no_background_commands()) }
    }
    /// The sandbox's entrance to the egress proxy for `127.0.0.1:port` inside: a non-blocking TCP listener in the
    /// sandbox's own network namespace (process tier) or a unix socket its agent bridges that port to (gVisor), held
    /// by the server: the egress proxy accepts the sandbox's connections on it.
    fn listen_in_sandbox(&self, id: &str, port: u16) -> Result<Entrance, Failure> {
        let _ = (id, port);
        Err(Failure::new(FailureKind::Internal, "this runtime has no network namespaces"))
    }
}

fn no_background_commands() -> Failure {
    Failure::new(FailureKind::ExecFailed, "this runtime has no background commands")
}

fn no_code_interpreter() -> Failure {
    Failure::new(FailureKind::ExecFailed, "this runtime has no code interpreter")
}

/// Result of a boxed runtime call.
type Boxed<'a, T> = BoxFuture<'a, Result<T, Failure>>;

/// `SandboxRuntime` behind a pointer: the server's state holds `Arc<dyn DynRuntime>` so that handlers, the router and
/// the OpenAPI description are not generic over the runtime.
pub(crate) trait DynRuntime: Send + Sync + 'static {
    fn tier_unavailable(&self, tier: Tier) -> Option<String>;
    fn create<'a>(&'a self, id: &'a str, spec: &'a SandboxSpec) -> Boxed<'a, ()>;
    fn destroy<'a>(&'a self, id: &'a str) -> Boxed<'a, ()>;
    fn is_alive(&self, id: &str) -> bool;
    fn listen_in_sandbox(&self, id: &str, port: u16) -> Result<Entrance, Failure>;
    fn exec<'a>(&'a self, id: &'a str, spec: CommandSpec, events: mpsc::Sender<OutputChunk>) -> Boxed<'a, CommandExit>;
    fn read_file<'a>(&'a self, id: &'a str, path: &'a str, max_bytes: u64) -> Boxed<'a, Vec<u8>>;
    fn write_file<'a>(&'a self, id: &'a str, path: &'a str, data: Vec<u8>) -> Boxed<'a, ()>;
    fn list_dir<'a>(&'a self, id: &'a str, path: &'a str) -> Boxed<'a, Vec<FileInfo>>;
    fn stat<'a>(&'a self, id: &'a str, path: &'a str) -> Boxed<'a, FileInfo>;
    fn mkdir<'a>(&'a self, id: &'a str, path: &'a str, parents: bool) -> Boxed<'a, ()>;
    fn rename<'a>(&'a self, id: &'a str, from: &'a str, to: &'a str) -> Boxed<'a, ()>;
    fn remove<'a>(&'a self, id: &'a str, path: &'a str, recursive: bool) -> Boxed<'a, ()>;
    fn create_context<'a>(&'a self, id: &'a str, language: CodeLanguage) -> Boxed<'a, ContextInfo>;
    fn prepare_context<'a>(&'a self, id: &'a str, language: CodeLanguage, preload: Vec<String>) -> Boxed<'a, ()>;
    fn discard_prepared_contexts<'a>(&'a self, id: &'a str) -> Boxed<'a, ()>;
    fn list_contexts<'a>(&'a self, id: &'a str) -> Boxed<'a, Vec<ContextInfo>>;
    fn remove_context<'a>(&'a self, id: &'a str, context: &'a str) -> Boxed<'a, ()>;
    fn restart_context<'a>(&'a self, id: &'a str, context: &'a str) -> Boxed<'a, ContextInfo>;
    fn run_code<'a>(
        &'a self,
        id: &'a str,
        request: CodeRun,
        events: mpsc::Sender<OutputChunk>,
    ) -> Boxed<'a, CellOutcome>;
    fn start_command<'a>(
        &'a self,
        id: &'a str,
        command_id: &'a str,
        spec: CommandSpec,
        output_limit: u64,
    ) -> Boxed<'a, CommandStatus>;
    fn list_commands<'a>(&'a self, id: &'a str) -> Boxed<'a, Vec<CommandStatus>>;
    fn stream_command<'a>(
        &'a self,
        id: &'a str,
        command_id: &'a str,
        offset: u64,
    ) -> Boxed<'a, mpsc::Receiver<CommandEvent>>;
    fn command_stdin<'a>(&'a self, id: &'a str, command_id: &'a str, data: Vec<u8>, eof: bool) -> Boxed<'a, ()>;
    fn signal_command<'a>(&'a self, id: &'a str, command_id: &'a str, signal: i32) -> Boxed<'a, ()>;
}

impl<R: SandboxRuntime> DynRuntime for R {
    fn tier_unavailable(&self, tier: Tier) -> Option<String> {
        SandboxRuntime::tier_unavailable(self, tier)
    }
    fn create<'a>(&'a self, id: &'a str, spec: &'a SandboxSpec) -> Boxed<'a, ()> {
        Box::pin(SandboxRuntime::create(self, id, spec))
    }
    fn destroy<'a>(&'a self, id: &'a str) -> Boxed<'a, ()> {
        Box::pin(SandboxRuntime::destroy(self, id))
    }
    fn is_alive(&self, id: &str) -> bool {
        SandboxRuntime::is_alive(self, id)
    }
    fn listen_in_sandbox(&self, id: &str, port: u16) -> Result<Entrance, Failure> {
        SandboxRuntime::listen_in_sandbox(self, id, port)
    }
    fn exec<'a>(&'a self, id: &'a str, spec: CommandSpec, events: mpsc::Sender<OutputChunk>) -> Boxed<'a, CommandExit> {
        Box::pin(SandboxRuntime::exec(self, id, spec, events))
    }
    fn read_file<'a>(&'a self, id: &'a str, path: &'a str, max_bytes: u64) -> Boxed<'a, Vec<u8>> {
        Box::pin(SandboxRuntime::read_file(self, id, path, max_bytes))
    }
    fn write_file<'a>(&'a self, id: &'a str, path: &'a str, data: Vec<u8>) -> Boxed<'a, ()> {
        Box::pin(SandboxRuntime::write_file(self, id, path, data))
    }
    fn list_dir<'a>(&'a self, id: &'a str, path: &'a str) -> Boxed<'a, Vec<FileInfo>> {
        Box::pin(SandboxRuntime::list_dir(self, id, path))
    }
    fn stat<'a>(&'a self, id: &'a str, path: &'a str) -> Boxed<'a, FileInfo> {
        Box::pin(SandboxRuntime::stat(self, id, path))
    }
    fn mkdir<'a>(&'a self, id: &'a str, path: &'a str, parents: bool) -> Boxed<'a, ()> {
        Box::pin(SandboxRuntime::mkdir(self, id, path, parents))
    }
    fn rename<'a>(&'a self, id: &'a str, from: &'a str, to: &'a str) -> Boxed<'a, ()> {
        Box::pin(SandboxRuntime::rename(self, id, from, to))
    }
    fn remove<'a>(&'a self, id: &'a str, path: &'a str, recursive: bool) -> Boxed<'a, ()> {
        Box::pin(SandboxRuntime::remove(self, id, path, recursive))
    }
    fn create_context<'a>(&'a self, id: &'a str, language: CodeLanguage) -> Boxed<'a, ContextInfo> {
        Box::pin(SandboxRuntime::create_context(self, id, language))
    }
    fn prepare_context<'a>(&'a self, id: &'a str, language: CodeLanguage, preload: Vec<String>) -> Boxed<'a, ()> {
        Box::pin(SandboxRuntime::prepare_context(self, id, language, preload))
    }
    fn discard_prepared_contexts<'a>(&'a self, id: &'a str) -> Boxed<'a, ()> {
        Box::pin(SandboxRuntime::discard_prepared_contexts(self, id))
    }
    fn list_contexts<'a>(&'a self, id: &'a str) -> Boxed<'a, Vec<ContextInfo>> {
        Box::pin(SandboxRuntime::list_contexts(self, id))
    }
    fn remove_context<'a>(&'a self, id: &'a str, context: &'a str) -> Boxed<'a, ()> {
        Box::pin(SandboxRuntime::remove_context(self, id, context))
    }
    fn restart_context<'a>(&'a self, id: &'a str, context: &'a str) -> Boxed<'a, ContextInfo> {
        Box::pin(SandboxRuntime::restart_context(self, id, context))
    }
    fn run_code<'a>(
        &'a self,
        id: &'a str,
        request: CodeRun,
        events: mpsc::Sender<OutputChunk>,
    ) -> Boxed<'a, CellOutcome> {
        Box::pin(SandboxRuntime::run_code(self, id, request, events))
    }
    fn start_command<'a>(
        &'a self,
        id: &'a str,
        command_id: &'a str,
        spec: CommandSpec,
        output_limit: u64,
    ) -> Boxed<'a, CommandStatus> {
        Box::pin(SandboxRuntime::start_command(self, id, command_id, spec, output_limit))
    }
    fn list_commands<'a>(&'a self, id: &'a str) -> Boxed<'a, Vec<CommandStatus>> {
        Box::pin(SandboxRuntime::list_commands(self, id))
    }
    fn stream_command<'a>(
        &'a self,
        id: &'a str,
        command_id: &'a str,
        offset: u64,
    ) -> Boxed<'a, mpsc::Receiver<CommandEvent>> {
        Box::pin(SandboxRuntime::stream_command(self, id, command_id, offset))
    }
    fn command_stdin<'a>(&'a self, id: &'a str, command_id: &'a str, data: Vec<u8>, eof: bool) -> Boxed<'a, ()> {
        Box::pin(SandboxRuntime::command_stdin(self, id, command_id, data, eof))
    }
    fn signal_command<'a>(&'a self, id: &'a str, command_id: &'a str, signal: i32) -> Boxed<'a, ()> {
        Box::pin(SandboxRuntime::signal_command(self, id, command_id, signal))
    }
}
