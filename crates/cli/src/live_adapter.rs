//! Plugs the real runtime (`sandkasten_runtime::live::LiveRuntime`: spawner + agents) into the HTTP server's
//! `SandboxRuntime` seam, translating agent failures into the server's failure kinds.

use sandkasten_protocol::{FailureCode, OutputStreamKind};
use sandkasten_runtime::RuntimeError;
use sandkasten_runtime::live::{AgentFailure, LiveRuntime};
use sandkasten_server::runtime::{FailureKind, OutputChunk, RuntimeFailure, SandboxRuntime, Stream};
use sandkasten_types::{CommandExit, CommandSpec, FileInfo, SandboxSpec};
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
        Some(FailureCode::Busy | FailureCode::Internal) => FailureKind::Internal,
    };
    RuntimeFailure::new(kind, failure.message)
}

fn from_runtime(error: RuntimeError) -> RuntimeFailure {
    match error {
        RuntimeError::InvalidInput(message) => RuntimeFailure::new(FailureKind::InvalidPath, message),
        other => RuntimeFailure::new(FailureKind::Internal, other.to_string()),
    }
}

impl LiveAdapter {
    fn agent(&self, id: &str) -> Result<std::sync::Arc<sandkasten_runtime::live::AgentClient>, RuntimeFailure> {
        self.0.agent(id).ok_or_else(|| RuntimeFailure::new(FailureKind::SandboxGone, format!("sandbox {id} is not running")))
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

    async fn exec(
        &self,
        id: &str,
        spec: CommandSpec,
        events: mpsc::Sender<OutputChunk>,
    ) -> Result<CommandExit, RuntimeFailure> {
        let agent = self.agent(id)?;
        let (chunks, mut received) = mpsc::channel(64);
        let forward = async move {
            while let Some((stream, data)) = received.recv().await {
                let stream = match stream {
                    OutputStreamKind::Stdout => Stream::Stdout,
                    OutputStreamKind::Stderr => Stream::Stderr,
                };
                // The server may stop listening (a client hung up): the command still runs to its end.
                let _ = events.send(OutputChunk { stream, data }).await;
            }
        };
        let (outcome, ()) = tokio::join!(agent.exec(spec, chunks), forward);
        outcome.map_err(from_agent)
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
}
