//! Plugs the real runtime (`sandkasten_runtime::live::LiveRuntime`: spawner + agents) into the HTTP server's
//! `SandboxRuntime` seam (sandboxes, commands, files, code contexts).

use sandkasten_runtime::live::LiveRuntime;
use sandkasten_server::runtime::{Entrance, SandboxRuntime};
use sandkasten_types::{
    CellOutcome, CodeLanguage, CodeRun, CommandEvent, CommandExit, CommandSpec, CommandStatus, ContextInfo, Failure,
    FailureKind, FileInfo, OutputChunk, SandboxSpec,
};
use tokio::sync::mpsc;

/// The live runtime behind the server.
pub struct LiveAdapter(pub LiveRuntime);

impl LiveAdapter {
    fn agent(&self, id: &str) -> Result<std::sync::Arc<sandkasten_runtime::live::AgentClient>, Failure> {
        self.0.agent(id).ok_or_else(|| Failure::new(FailureKind::SandboxGone, format!("sandbox {id} is not running")))
    }
}

impl SandboxRuntime for LiveAdapter {
    async fn create(&self, id: &str, spec: &SandboxSpec) -> Result<(), Failure> {
        self.0.create(id, spec).await
    }

    async fn destroy(&self, id: &str) -> Result<(), Failure> {
        self.0.destroy(id).await.map(drop)
    }

    fn is_alive(&self, id: &str) -> bool {
        self.0.is_alive(id)
    }

    fn tier_unavailable(&self, tier: sandkasten_types::Tier) -> Option<String> {
        self.0.tier_unavailable(tier)
    }

    fn listen_in_sandbox(&self, id: &str, port: u16) -> Result<Entrance, Failure> {
        match self.0.listen_in_sandbox(id, port) {
            Some(Ok(entrance)) => Ok(entrance),
            // Code inside bound the port first (possible while the policy was none): the sandbox's doing, not ours.
            Some(Err(error)) if error.kind() == std::io::ErrorKind::AddrInUse => Err(Failure::new(
                FailureKind::Conflict,
                format!(
                    "port {port} inside sandbox {id} is in use by a process in the sandbox; the egress proxy listens \
                     there: stop that process and retry"
                ),
            )),
            Some(Err(error)) => Err(Failure::new(
                FailureKind::Internal,
                format!("cannot open the egress proxy's port {port} inside sandbox {id}: {error}"),
            )),
            None => Err(Failure::new(FailureKind::SandboxGone, format!("sandbox {id} is not running"))),
        }
    }

    async fn exec(
        &self,
        id: &str,
        spec: CommandSpec,
        events: mpsc::Sender<OutputChunk>,
    ) -> Result<CommandExit, Failure> {
        self.0.exec(id, spec, events).await
    }

    async fn read_file(&self, id: &str, path: &str, max_bytes: u64) -> Result<Vec<u8>, Failure> {
        self.agent(id)?.read_file(path, max_bytes).await
    }

    async fn write_file(&self, id: &str, path: &str, data: Vec<u8>) -> Result<(), Failure> {
        self.agent(id)?.write_file(path, &data).await
    }

    async fn list_dir(&self, id: &str, path: &str) -> Result<Vec<FileInfo>, Failure> {
        self.agent(id)?.list_dir(path).await
    }

    async fn stat(&self, id: &str, path: &str) -> Result<FileInfo, Failure> {
        self.agent(id)?.stat(path).await
    }

    async fn mkdir(&self, id: &str, path: &str, parents: bool) -> Result<(), Failure> {
        self.agent(id)?.mkdir(path, parents).await
    }

    async fn rename(&self, id: &str, from: &str, to: &str) -> Result<(), Failure> {
        self.agent(id)?.rename(from, to).await
    }

    async fn remove(&self, id: &str, path: &str, recursive: bool) -> Result<(), Failure> {
        self.agent(id)?.remove(path, recursive).await
    }

    async fn create_context(&self, id: &str, language: CodeLanguage) -> Result<ContextInfo, Failure> {
        self.0.create_context(id, language).await
    }

    async fn prepare_context(&self, id: &str, language: CodeLanguage, preload: Vec<String>) -> Result<(), Failure> {
        self.0.prepare_context(id, language, &preload).await
    }

    async fn discard_prepared_contexts(&self, id: &str) -> Result<(), Failure> {
        self.0.discard_prepared_contexts(id).await;
        Ok(())
    }

    async fn list_contexts(&self, id: &str) -> Result<Vec<ContextInfo>, Failure> {
        self.0.list_contexts(id)
    }

    async fn remove_context(&self, id: &str, context: &str) -> Result<(), Failure> {
        self.0.remove_context(id, context).await
    }

    async fn restart_context(&self, id: &str, context: &str) -> Result<ContextInfo, Failure> {
        self.0.restart_context(id, context).await
    }

    async fn run_code(
        &self,
        id: &str,
        request: CodeRun,
        events: mpsc::Sender<OutputChunk>,
    ) -> Result<CellOutcome, Failure> {
        self.0.run_code(id, request, events).await
    }

    async fn start_command(
        &self,
        id: &str,
        command_id: &str,
        spec: CommandSpec,
        output_limit: u64,
    ) -> Result<CommandStatus, Failure> {
        self.0.start_command(id, command_id, spec, output_limit).await
    }

    async fn list_commands(&self, id: &str) -> Result<Vec<CommandStatus>, Failure> {
        self.0.list_commands(id)
    }

    async fn stream_command(
        &self,
        id: &str,
        command_id: &str,
        offset: u64,
    ) -> Result<mpsc::Receiver<CommandEvent>, Failure> {
        self.0.stream_command(id, command_id, offset)
    }

    async fn command_stdin(&self, id: &str, command_id: &str, data: Vec<u8>, eof: bool) -> Result<(), Failure> {
        self.0.command_stdin(id, command_id, &data, eof).await
    }

    async fn signal_command(&self, id: &str, command_id: &str, signal: i32) -> Result<(), Failure> {
        self.0.signal_command(id, command_id, signal).await
    }
}
