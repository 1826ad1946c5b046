//! The seam between the HTTP server and whatever runs long-lived sandboxes: the `SandboxRuntime` trait. It is
//! object-safe (every async method returns a boxed `RuntimeFuture`), so the server holds an `Arc<dyn SandboxRuntime>`;
//! `live::LiveRuntime` implements it, and so does the server's in-memory test fake. Output arrives as
//! `OutputChunk`s, failures are `Failure`s whose kind the server maps to an HTTP status.

use std::future::Future;
use std::pin::Pin;

use sandkasten_types::{
    CellOutcome, CodeLanguage, CodeRun, CommandEvent, CommandExit, CommandSpec, CommandStatus, CommandUser,
    ContextInfo, Entrance, Failure, FailureKind, FileInfo, FileMetadata, FsEvent, OutputChunk, PtySize, SandboxSpec,
    SandboxUsage, Tier,
};
use tokio::sync::{mpsc, oneshot};

use crate::retained::OutputRetention;

/// Interrupts a running cell (as its timeout does) when a value arrives; a dropped sender never interrupts.
pub type CellInterrupt = oneshot::Receiver<()>;

/// What an async `SandboxRuntime` method returns: a boxed future of its result (write the body as
/// `Box::pin(async move { … })`).
pub type RuntimeFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, Failure>> + Send + 'a>>;

/// A sandbox that died on its own (`SandboxRuntime::take_lost`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostSandbox {
    /// Its id.
    pub id: String,
    /// Why, where its tier could tell (a microVM guest's kernel panic line).
    pub why: Option<String>,
}

/// Runs long-lived sandboxes. Implemented by the real runtime (`live::LiveRuntime`) and by test fakes.
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
    /// The acceleration a new sandbox of `tier` would get here: `kvm` or `tcg` for `microvm` (as its backend
    /// chooses for QEMU), `None` for the other tiers. Cheap: the server asks before creates that `auto` decides. The
    /// default runs no microVMs.
    fn tier_accel(&self, tier: Tier) -> Option<sandkasten_types::MicrovmAccel> {
        let _ = tier;
        None
    }
    /// Why the runtime cannot serve now (a part of it failed and is being restarted), or `None` when it can. The
    /// server's `/healthz` answers 503 with this reason. Cheap: it is called on every health check.
    fn unhealthy(&self) -> Option<String> {
        None
    }
    /// How the microVM sandbox `id`'s guest started (the acceleration QEMU runs it with, when it booted), as its
    /// backend reported it; `None` for the other tiers and unknown sandboxes. The default knows of no VM.
    fn vm_boot(&self, id: &str) -> Option<crate::VmBoot> {
        let _ = id;
        None
    }
    /// Sandboxes that died on their own since the last call (their processes are gone; the server marks them lost).
    fn take_lost(&self) -> Vec<LostSandbox> {
        Vec::new()
    }
    /// Why sandbox `id`, which a request just found gone (`FailureKind::SandboxGone`), ended, where its tier can
    /// tell (a microVM guest's kernel panic line); `None` otherwise.
    fn why_ended<'a>(&'a self, id: &'a str) -> RuntimeFuture<'a, Option<String>> {
        let _ = id;
        Box::pin(async { Ok(None) })
    }
    /// The most processes one sandbox may have on this host (`limits.pids` above it is refused before anything
    /// exists). The default allows what any spec may ask for.
    fn max_pids(&self) -> u64 {
        sandkasten_types::MAX_PIDS
    }
    /// Creates and starts the sandbox `id` on the tier `spec.isolation` (always set by the server); on failure
    /// nothing of it may remain.
    fn create<'a>(&'a self, id: &'a str, spec: &'a SandboxSpec) -> RuntimeFuture<'a, ()>;
    /// Stops the sandbox and removes everything it holds (paused or not). Destroying an unknown sandbox is
    /// `NotFound`.
    fn destroy<'a>(&'a self, id: &'a str) -> RuntimeFuture<'a, ()>;
    /// Pauses (`pause: true`) or resumes a sandbox as its tier can: the process tier freezes its cgroup (no CPU,
    /// memory kept), gVisor checkpoints it to disk (nothing of it runs; the resume restores it, its commands and code
    /// contexts carrying on). A tier that cannot is `Conflict` saying which can; while paused the sandbox's agent does not
    /// answer, so callers must not send it requests.
    fn set_paused<'a>(&'a self, id: &'a str, pause: bool) -> RuntimeFuture<'a, ()> {
        let _ = (id, pause);
        refuse(Failure::new(FailureKind::Conflict, "this runtime cannot pause sandboxes"))
    }
    /// Saves the running sandbox's whole memory state (processes, their open files, its tmpfs files) into `dir`
    /// (created 0700, the caller's to remove) while it keeps running; requests wait meanwhile. gVisor (`runsc
    /// checkpoint --leave-running`) and microVM (QEMU's migration to a file) only: the process tier, and this
    /// default, refuse naming the tiers that can.
    fn memory_snapshot<'a>(&'a self, id: &'a str, dir: &'a std::path::Path) -> RuntimeFuture<'a, ()> {
        let _ = (id, dir);
        refuse(no_memory_snapshots())
    }
    /// Creates the sandbox `id` (its own cgroup, channel and host files) from a memory snapshot in `dir` of a
    /// sandbox created with the same `spec`: it runs on from where the source was, with the source's processes and
    /// environment (commands and code contexts it had are not this runtime's: only its files and new requests are).
    /// gVisor and microVM only; the process tier, and this default, refuse naming the tiers that can.
    fn create_from_memory<'a>(
        &'a self,
        id: &'a str,
        spec: &'a SandboxSpec,
        dir: &'a std::path::Path,
    ) -> RuntimeFuture<'a, ()> {
        let _ = (id, spec, dir);
        refuse(no_memory_snapshots())
    }
    /// What a running sandbox uses now (CPU time, memory held, disk fill), for the server's metrics samples; a paused
    /// sandbox is `Conflict`. Cheap enough to call every few seconds. The default refuses.
    fn usage<'a>(&'a self, id: &'a str) -> RuntimeFuture<'a, SandboxUsage> {
        let _ = id;
        refuse(Failure::new(FailureKind::Conflict, "this runtime cannot report what a sandbox uses"))
    }
    /// True while the sandbox's processes are alive (used by the startup reconcile).
    fn is_alive(&self, id: &str) -> bool;
    /// Runs a command to its end; output chunks are sent to `events` as they arrive (the receiver may be dropped:
    /// keep going). Past `output_limit` bytes of a stream (the caller keeps no more) the stream is no longer read:
    /// its writer gets `EPIPE`. `spec.timeout_ms` is always set by the server.
    fn exec<'a>(
        &'a self,
        id: &'a str,
        spec: CommandSpec,
        output_limit: u64,
        events: mpsc::Sender<OutputChunk>,
    ) -> RuntimeFuture<'a, CommandExit>;
    /// Reads a whole regular file as `user`; `TooLarge` when it is bigger than `max_bytes`.
    ///
    /// The file calls act as `user`: the sandbox user, or the sandbox's root (uid 0 inside its user namespace, with no
    /// capability: what a command run as root could do). The forms without `_as` act as the sandbox user.
    fn read_file_as<'a>(
        &'a self,
        id: &'a str,
        path: &'a str,
        max_bytes: u64,
        user: CommandUser,
    ) -> RuntimeFuture<'a, Vec<u8>>;
    /// Creates or replaces a regular file with `data`, as `user`.
    fn write_file_as<'a>(
        &'a self,
        id: &'a str,
        path: &'a str,
        data: Vec<u8>,
        user: CommandUser,
    ) -> RuntimeFuture<'a, ()>;
    /// Lists a directory (not recursive), as `user`.
    fn list_dir_as<'a>(&'a self, id: &'a str, path: &'a str, user: CommandUser) -> RuntimeFuture<'a, Vec<FileInfo>>;
    /// Describes one path without following a final symlink, as `user`.
    fn stat_as<'a>(&'a self, id: &'a str, path: &'a str, user: CommandUser) -> RuntimeFuture<'a, FileInfo>;
    /// Creates a directory, and its missing parents when `parents` is set, as `user`.
    fn mkdir_as<'a>(&'a self, id: &'a str, path: &'a str, parents: bool, user: CommandUser) -> RuntimeFuture<'a, ()>;
    /// Renames a path inside the sandbox, as `user`.
    fn rename_as<'a>(&'a self, id: &'a str, from: &'a str, to: &'a str, user: CommandUser) -> RuntimeFuture<'a, ()>;
    /// Removes a file, or a directory (with its contents when `recursive` is set), as `user`.
    fn remove_as<'a>(&'a self, id: &'a str, path: &'a str, recursive: bool, user: CommandUser)
    -> RuntimeFuture<'a, ()>;
    /// Replaces the user metadata (`FileInfo::metadata`) of a regular file or directory, as `user`: keys not in
    /// `metadata` are removed. A filesystem without user extended attributes is `InvalidPath`.
    fn set_metadata<'a>(
        &'a self,
        id: &'a str,
        path: &'a str,
        metadata: FileMetadata,
        user: CommandUser,
    ) -> RuntimeFuture<'a, ()>;
    /// `read_file_as` the sandbox user.
    fn read_file<'a>(&'a self, id: &'a str, path: &'a str, max_bytes: u64) -> RuntimeFuture<'a, Vec<u8>> {
        self.read_file_as(id, path, max_bytes, CommandUser::Sandbox)
    }
    /// `write_file_as` the sandbox user.
    fn write_file<'a>(&'a self, id: &'a str, path: &'a str, data: Vec<u8>) -> RuntimeFuture<'a, ()> {
        self.write_file_as(id, path, data, CommandUser::Sandbox)
    }
    /// `list_dir_as` the sandbox user.
    fn list_dir<'a>(&'a self, id: &'a str, path: &'a str) -> RuntimeFuture<'a, Vec<FileInfo>> {
        self.list_dir_as(id, path, CommandUser::Sandbox)
    }
    /// `stat_as` the sandbox user.
    fn stat<'a>(&'a self, id: &'a str, path: &'a str) -> RuntimeFuture<'a, FileInfo> {
        self.stat_as(id, path, CommandUser::Sandbox)
    }
    /// `mkdir_as` the sandbox user.
    fn mkdir<'a>(&'a self, id: &'a str, path: &'a str, parents: bool) -> RuntimeFuture<'a, ()> {
        self.mkdir_as(id, path, parents, CommandUser::Sandbox)
    }
    /// `rename_as` the sandbox user.
    fn rename<'a>(&'a self, id: &'a str, from: &'a str, to: &'a str) -> RuntimeFuture<'a, ()> {
        self.rename_as(id, from, to, CommandUser::Sandbox)
    }
    /// `remove_as` the sandbox user.
    fn remove<'a>(&'a self, id: &'a str, path: &'a str, recursive: bool) -> RuntimeFuture<'a, ()> {
        self.remove_as(id, path, recursive, CommandUser::Sandbox)
    }
    /// Watches the directory `path` in the sandbox (as its user; `recursive`: its subdirectories too, also those
    /// made later) and returns once the watch runs. Its events arrive at `events` in order, a frame at a time (one
    /// the receiver has no room for is dropped), until the receiver is dropped (the watch stops) or the directory or
    /// the sandbox goes away (the sender is dropped). A path that is not a directory is `InvalidPath`.
    fn watch_dir<'a>(
        &'a self,
        id: &'a str,
        path: &'a str,
        recursive: bool,
        events: mpsc::Sender<Vec<FsEvent>>,
    ) -> RuntimeFuture<'a, ()> {
        let _ = (id, path, recursive, events);
        refuse(Failure::new(FailureKind::Conflict, "this runtime cannot watch directories"))
    }

    /// Creates a code context (an interpreter whose state persists across cells) in `cwd` (`None`: the sandbox's
    /// default working directory) and starts it. Runtimes without a code interpreter keep this default, which refuses.
    fn create_context<'a>(
        &'a self,
        id: &'a str,
        language: CodeLanguage,
        cwd: Option<String>,
    ) -> RuntimeFuture<'a, ContextInfo> {
        let _ = (id, language, cwd);
        refuse(no_code_interpreter())
    }
    /// Starts a spare interpreter of `language` in the sandbox, with the `preload` modules loaded, which the sandbox's
    /// first code context of that language adopts instead of starting cold (a warm pool member's, made before any
    /// caller has the sandbox). Runtimes without a code interpreter keep this default, which refuses.
    fn prepare_context<'a>(
        &'a self,
        id: &'a str,
        language: CodeLanguage,
        preload: Vec<String>,
    ) -> RuntimeFuture<'a, ()> {
        let _ = (id, language, preload);
        refuse(no_code_interpreter())
    }
    /// Kills the sandbox's spare interpreters, if any (the sandbox will run no code context: their memory and pids
    /// are the caller's).
    fn discard_prepared_contexts<'a>(&'a self, id: &'a str) -> RuntimeFuture<'a, ()> {
        let _ = id;
        Box::pin(async { Ok(()) })
    }
    /// The code contexts of a sandbox.
    fn list_contexts<'a>(&'a self, id: &'a str) -> RuntimeFuture<'a, Vec<ContextInfo>> {
        let _ = id;
        refuse(no_code_interpreter())
    }
    /// Removes a code context; an unknown context is `NotFound`.
    fn remove_context<'a>(&'a self, id: &'a str, context: &'a str) -> RuntimeFuture<'a, ()> {
        let _ = (id, context);
        refuse(no_code_interpreter())
    }
    /// Restarts a code context's interpreter (its state is lost); an unknown context is `NotFound`.
    fn restart_context<'a>(&'a self, id: &'a str, context: &'a str) -> RuntimeFuture<'a, ContextInfo> {
        let _ = (id, context);
        refuse(no_code_interpreter())
    }
    /// Runs one cell in a context (the language's default context when `request.context_id` is `None`); its output
    /// is sent to `events` as it arrives. `request.timeout_ms` is always set by the server; a value sent on
    /// `interrupt` stops the cell earlier, as its timeout would. A sandbox that ends during the cell is `SandboxGone`.
    fn run_code<'a>(
        &'a self,
        id: &'a str,
        request: CodeRun,
        events: mpsc::Sender<OutputChunk>,
        interrupt: Option<CellInterrupt>,
    ) -> RuntimeFuture<'a, CellOutcome> {
        let _ = (id, request, events, interrupt);
        refuse(no_code_interpreter())
    }

    /// Starts a command in the background under `command_id` (chosen by the server) and returns at once. When
    /// `spec.stdin` is set it is written and stdin closed; otherwise stdin stays open for `command_stdin`. What
    /// `retention` allows of each output stream is retained for `stream_command` (charged to its budget while kept;
    /// past `retention.per_stream` the stream is no longer read). `spec.timeout_ms` is always set.
    fn start_command<'a>(
        &'a self,
        id: &'a str,
        command_id: &'a str,
        spec: CommandSpec,
        retention: OutputRetention,
    ) -> RuntimeFuture<'a, CommandStatus> {
        let _ = (id, command_id, spec, retention);
        refuse(no_background_commands())
    }
    /// The running and recently ended background commands of a sandbox (a bounded list), oldest first.
    fn list_commands<'a>(&'a self, id: &'a str) -> RuntimeFuture<'a, Vec<CommandStatus>> {
        let _ = id;
        refuse(no_background_commands())
    }
    /// A background command's retained output from byte `offset` on, then its live output, then `Ended`; the
    /// stream stops when the receiver is dropped. An unknown command is `NotFound`.
    fn stream_command<'a>(
        &'a self,
        id: &'a str,
        command_id: &'a str,
        offset: u64,
    ) -> RuntimeFuture<'a, mpsc::Receiver<CommandEvent>> {
        let _ = (id, command_id, offset);
        refuse(no_background_commands())
    }
    /// Writes `data` to a background command's stdin and closes it when `eof` is set (`Conflict` once it ended or
    /// its stdin is closed).
    fn command_stdin<'a>(
        &'a self,
        id: &'a str,
        command_id: &'a str,
        data: Vec<u8>,
        eof: bool,
    ) -> RuntimeFuture<'a, ()> {
        let _ = (id, command_id, data, eof);
        refuse(no_background_commands())
    }
    /// Sends `signal` to a background command's process group (`Conflict` once it ended, except SIGKILL, which is
    /// then a no-op).
    fn signal_command<'a>(&'a self, id: &'a str, command_id: &'a str, signal: i32) -> RuntimeFuture<'a, ()> {
        let _ = (id, command_id, signal);
        refuse(no_background_commands())
    }
    /// Gives a background command's pseudo-terminal (`spec.pty`) a new size; its foreground process group gets
    /// `SIGWINCH` (`Conflict` once it ended, or when it has no pseudo-terminal).
    fn resize_command<'a>(&'a self, id: &'a str, command_id: &'a str, size: PtySize) -> RuntimeFuture<'a, ()> {
        let _ = (id, command_id, size);
        refuse(no_background_commands())
    }
    /// Streams a tar of the directories `dirs` (absolute, inside the sandbox) to `sink`, at the sink's pace, as the
    /// sandbox user sees them: the files of a filesystem snapshot. Works on every tier (the sandbox's own `tar` makes
    /// it). A sink that goes away ends the export with an error.
    fn export_files<'a>(
        &'a self,
        id: &'a str,
        dirs: Vec<String>,
        sink: mpsc::Sender<Vec<u8>>,
    ) -> RuntimeFuture<'a, ()> {
        let _ = (id, dirs, sink);
        refuse(Failure::new(FailureKind::Conflict, "this runtime cannot archive a sandbox's files"))
    }
    /// Unpacks the tar arriving on `source` at `/` inside the sandbox, as the sandbox user (existing directories keep
    /// their owner and mode). Returns once the archive is unpacked; a bad or truncated archive is `Conflict` with
    /// tar's words.
    fn import_files<'a>(&'a self, id: &'a str, source: mpsc::Receiver<Vec<u8>>) -> RuntimeFuture<'a, ()> {
        let _ = (id, source);
        refuse(Failure::new(FailureKind::Conflict, "this runtime cannot unpack files into a sandbox"))
    }
    /// Opens a connection to `127.0.0.1:port` inside the sandbox, made by its agent in the sandbox's own network
    /// namespace (process tier) or network stack (gVisor), so no host port is opened and nothing of the host's
    /// network is reachable; its bytes travel over the agent's channel. Nothing listening there is
    /// `NothingListening`; more than `sandkasten_protocol::MAX_PORT_STREAMS` open at once is `Conflict`.
    fn open_port<'a>(&'a self, id: &'a str, port: u16) -> RuntimeFuture<'a, crate::live::PortStream> {
        let _ = (id, port);
        refuse(Failure::new(FailureKind::Conflict, "this runtime cannot connect to a sandbox's ports"))
    }
    /// The sandbox's entrance to the egress proxy for `127.0.0.1:port` inside: a non-blocking TCP listener in the
    /// sandbox's own network namespace (process tier) or a unix socket its agent bridges that port to (gVisor), held
    /// by the server: the egress proxy accepts the sandbox's connections on it. A port that code inside holds already
    /// is `Conflict`.
    fn listen_in_sandbox(&self, id: &str, port: u16) -> Result<Entrance, Failure> {
        let _ = (id, port);
        Err(Failure::new(FailureKind::Internal, "this runtime has no network namespaces"))
    }
}

/// A runtime call that fails at once.
fn refuse<'a, T: Send + 'a>(failure: Failure) -> RuntimeFuture<'a, T> {
    Box::pin(async move { Err(failure) })
}

fn no_background_commands() -> Failure {
    Failure::new(FailureKind::ExecFailed, "this runtime has no background commands")
}

fn no_memory_snapshots() -> Failure {
    Failure::new(
        FailureKind::Conflict,
        "memory snapshots need the gvisor or microvm tier; this runtime cannot take or start one",
    )
}

fn no_code_interpreter() -> Failure {
    Failure::new(FailureKind::ExecFailed, "this runtime has no code interpreter")
}
