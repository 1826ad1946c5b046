//! Plugs the real runtime (`sandkasten_runtime::live::LiveRuntime`: spawner + agents) into the HTTP server's
//! `SandboxRuntime` seam (sandboxes, commands, files, code contexts), translating agent failures into the server's
//! failure kinds.

use sandkasten_protocol::FailureCode;
use sandkasten_runtime::RuntimeError;
use sandkasten_runtime::live::commands::{CommandEvent as LiveEvent, CommandStatus as LiveStatus};
use sandkasten_runtime::live::{AgentFailure, CommandError, ContextError, LiveRuntime};
use sandkasten_server::runtime::{Entrance, FailureKind, RuntimeFailure, SandboxRuntime};
use sandkasten_server::{CommandEvent, CommandStatus};
use sandkasten_types::{
    CellOutcome, CodeLanguage, CodeRun, CommandExit, CommandSpec, ContextInfo, FileInfo, OutputChunk, SandboxSpec,
};
use tokio::sync::mpsc;

/// The live runtime behind the server.
pub struct LiveAdapter(pub LiveRuntime);

fn from_agent(failure: AgentFailure) -> RuntimeFailure {
    let kind = match failure.code {
        None => FailureKind::SandboxGone,
        Some(FailureCode::NotFound) => FailureKind::NotFound,
        Some(FailureCode::PermissionDenied) => FailureKind::PermissionDenied,
        Some(FailureCode::InvalidPath) => FailureKind::InvalidPath,
        Some(FailureCode::AlreadyExists) => FailureKind::AlreadyExists,
        Some(FailureCode::NotADirectory) => FailureKind::NotADirectory,
        Some(FailureCode::IsADirectory) => FailureKind::IsADirectory,
        Some(FailureCode::NotEmpty) => FailureKind::NotEmpty,
        Some(FailureCode::TooLarge) => FailureKind::TooLarge,
        Some(FailureCode::ExecFailed) => FailureKind::ExecFailed,
        // The agent cannot do it in this state (a mount point in the way, a tree too deep, too many commands): the
        // request conflicts with the sandbox's state, it is not the server failing.
        Some(FailureCode::Busy) => FailureKind::Conflict,
        Some(FailureCode::Internal) => FailureKind::Internal,
    };
    RuntimeFailure::new(kind, failure.message)
}

fn from_context(error: ContextError) -> RuntimeFailure {
    let kind = match &error {
        ContextError::NotFound(_) => FailureKind::NotFound,
        ContextError::SandboxGone => FailureKind::SandboxGone,
        ContextError::TooMany(_) | ContextError::LanguageMismatch { .. } | ContextError::StartFailed(_) => {
            FailureKind::ExecFailed
        }
        ContextError::Agent(failure) => return from_agent(failure.clone()),
        ContextError::Ids(_) => FailureKind::Internal,
    };
    RuntimeFailure::new(kind, error.to_string())
}

fn from_command(error: CommandError) -> RuntimeFailure {
    let kind = match &error {
        CommandError::NotFound(_) => FailureKind::NotFound,
        CommandError::SandboxGone => FailureKind::SandboxGone,
        CommandError::Ended(_) | CommandError::StdinClosed(_) | CommandError::TooMany(_) => FailureKind::Conflict,
        CommandError::Duplicate(_) => FailureKind::Internal,
        CommandError::Agent(failure) => return from_agent(failure.clone()),
    };
    RuntimeFailure::new(kind, error.to_string())
}

fn from_status(status: LiveStatus) -> CommandStatus {
    CommandStatus {
        id: status.id,
        argv: status.argv,
        pid: status.pid,
        started_ms: status.started_ms,
        ended_ms: status.ended_ms,
        exit: status.exit,
        stdout_truncated: status.stdout_truncated,
        stderr_truncated: status.stderr_truncated,
    }
}

fn from_runtime(error: RuntimeError) -> RuntimeFailure {
    match error {
        RuntimeError::InvalidInput(message) => RuntimeFailure::new(FailureKind::InvalidPath, message),
        other => RuntimeFailure::new(FailureKind::Internal, other.to_string()),
    }
}

impl LiveAdapter {
    fn agent(&self, id: &str) -> Result<std::sync::Arc<sandkasten_runtime::live::AgentClient>, RuntimeFailure> {
        self.0
            .agent(id)
            .ok_or_else(|| RuntimeFailure::new(FailureKind::SandboxGone, format!("sandbox {id} is not running")))
    }
}

impl SandboxRuntime for LiveAdapter {
    async fn create(&self, id: &str, spec: &SandboxSpec) -> Result<(), RuntimeFailure> {
        self.0.create(id, spec).await.map_err(from_runtime)
    }

    async fn destroy(&self, id: &str) -> Result<(), RuntimeFailure> {
        self.0.destroy(id).await.map(drop).map_err(|error| match error {
            RuntimeError::InvalidInput(message) => RuntimeFailure::new(FailureKind::NotFound, message),
            other => from_runtime(other),
        })
    }

    fn is_alive(&self, id: &str) -> bool {
        self.0.is_alive(id)
    }

    fn tier_unavailable(&self, tier: sandkasten_types::Tier) -> Option<String> {
        self.0.tier_unavailable(tier)
    }

    fn listen_in_sandbox(&self, id: &str, port: u16) -> Result<Entrance, RuntimeFailure> {
        match self.0.listen_in_sandbox(id, port) {
            Some(Ok(entrance)) => Ok(entrance),
            // Code inside bound the port first (possible while the policy was none): the sandbox's doing, not ours.
            Some(Err(error)) if error.kind() == std::io::ErrorKind::AddrInUse => Err(RuntimeFailure::new(
                FailureKind::Conflict,
                format!(
                    "port {port} inside sandbox {id} is in use by a process in the sandbox; the egress proxy listens \
                     there: stop that process and retry"
                ),
            )),
            Some(Err(error)) => Err(RuntimeFailure::new(
                FailureKind::Internal,
                format!("cannot open the egress proxy's port {port} inside sandbox {id}: {error}"),
            )),
            None => Err(RuntimeFailure::new(FailureKind::SandboxGone, format!("sandbox {id} is not running"))),
        }
    }

    async fn exec(
        &self,
        id: &str,
        spec: CommandSpec,
        events: mpsc::Sender<OutputChunk>,
    ) -> Result<CommandExit, RuntimeFailure> {
        self.0.exec(id, spec, events).await.map_err(from_agent)
    }

    async fn read_file(&self, id: &str, path: &str, max_bytes: u64) -> Result<Vec<u8>, RuntimeFailure> {
        self.agent(id)?.read_file(path, max_bytes).await.map_err(from_agent)
    }

    async fn write_file(&self, id: &str, path: &str, data: Vec<u8>) -> Result<(), RuntimeFailure> {
        self.agent(id)?.write_file(path, &data).await.map_err(from_agent)
    }

    async fn list_dir(&self, id: &str, path: &str) -> Result<Vec<FileInfo>, RuntimeFailure> {
        self.agent(id)?.list_dir(path).await.map_err(from_agent)
    }

    async fn stat(&self, id: &str, path: &str) -> Result<FileInfo, RuntimeFailure> {
        self.agent(id)?.stat(path).await.map_err(from_agent)
    }

    async fn mkdir(&self, id: &str, path: &str, parents: bool) -> Result<(), RuntimeFailure> {
        self.agent(id)?.mkdir(path, parents).await.map_err(from_agent)
    }

    async fn rename(&self, id: &str, from: &str, to: &str) -> Result<(), RuntimeFailure> {
        self.agent(id)?.rename(from, to).await.map_err(from_agent)
    }

    async fn remove(&self, id: &str, path: &str, recursive: bool) -> Result<(), RuntimeFailure> {
        self.agent(id)?.remove(path, recursive).await.map_err(from_agent)
    }

    async fn create_context(&self, id: &str, language: CodeLanguage) -> Result<ContextInfo, RuntimeFailure> {
        self.0.create_context(id, language).await.map_err(from_context)
    }

    async fn prepare_context(
        &self,
        id: &str,
        language: CodeLanguage,
        preload: Vec<String>,
    ) -> Result<(), RuntimeFailure> {
        self.0.prepare_context(id, language, &preload).await.map_err(from_context)
    }

    async fn discard_prepared_contexts(&self, id: &str) -> Result<(), RuntimeFailure> {
        self.0.discard_prepared_contexts(id).await;
        Ok(())
    }

    async fn list_contexts(&self, id: &str) -> Result<Vec<ContextInfo>, RuntimeFailure> {
        self.0.list_contexts(id).map_err(from_context)
    }

    async fn remove_context(&self, id: &str, context: &str) -> Result<(), RuntimeFailure> {
        self.0.remove_context(id, context).await.map_err(from_context)
    }

    async fn restart_context(&self, id: &str, context: &str) -> Result<ContextInfo, RuntimeFailure> {
        self.0.restart_context(id, context).await.map_err(from_context)
    }

    async fn run_code(
        &self,
        id: &str,
        request: CodeRun,
        events: mpsc::Sender<OutputChunk>,
    ) -> Result<CellOutcome, RuntimeFailure> {
        self.0.run_code(id, request, events).await.map_err(from_context)
    }

    async fn start_command(
        &self,
        id: &str,
        command_id: &str,
        spec: CommandSpec,
        output_limit: u64,
    ) -> Result<CommandStatus, RuntimeFailure> {
        self.0.start_command(id, command_id, spec, output_limit).await.map(from_status).map_err(from_command)
    }

    async fn list_commands(&self, id: &str) -> Result<Vec<CommandStatus>, RuntimeFailure> {
        let statuses = self.0.list_commands(id).map_err(from_command)?;
        Ok(statuses.into_iter().map(from_status).collect())
    }

    async fn stream_command(
        &self,
        id: &str,
        command_id: &str,
        offset: u64,
    ) -> Result<mpsc::Receiver<CommandEvent>, RuntimeFailure> {
        let mut received = self.0.stream_command(id, command_id, offset).map_err(from_command)?;
        let (events, forwarded) = mpsc::channel(16);
        tokio::spawn(async move {
            while let Some(event) = received.recv().await {
                let event = match event {
                    LiveEvent::Output(piece) => CommandEvent::Output {
                        chunk: OutputChunk { stream: piece.stream, data: piece.data },
                        offset: piece.end,
                    },
                    LiveEvent::Ended(status) => CommandEvent::Ended(from_status(status)),
                };
                // A dropped receiver (the client left) ends the forwarding, and with it the runtime's listener.
                if events.send(event).await.is_err() {
                    return;
                }
            }
        });
        Ok(forwarded)
    }

    async fn command_stdin(&self, id: &str, command_id: &str, data: Vec<u8>, eof: bool) -> Result<(), RuntimeFailure> {
        self.0.command_stdin(id, command_id, &data, eof).await.map_err(from_command)
    }

    async fn signal_command(&self, id: &str, command_id: &str, signal: i32) -> Result<(), RuntimeFailure> {
        self.0.signal_command(id, command_id, signal).await.map_err(from_command)
    }
}
