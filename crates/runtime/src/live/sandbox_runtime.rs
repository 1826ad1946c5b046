//! `LiveRuntime` as the server sees it: the `SandboxRuntime` implementation. Sandboxes are created and destroyed
//! through the spawner (its refusals become `InvalidPath` on create and `NotFound` on destroy, anything else
//! `Internal`), commands and files go to the sandbox's agent, code contexts to `Contexts`, background commands to
//! `BackgroundCommands`; a sandbox that is not running is `SandboxGone`.

use sandkasten_types::{
    CellOutcome, CodeLanguage, CodeRun, CommandEvent, CommandExit, CommandSpec, CommandStatus, CommandUser,
    ContextInfo, Entrance, Failure, FailureKind, FileInfo, FileMetadata, FsEvent, OutputChunk, PtySize, SandboxSpec,
    SandboxUsage, Tier,
};
use tokio::sync::mpsc;

use super::agent_client::sandbox_gone;
use super::runtime::LiveRuntime;
use crate::error::RuntimeError;
use crate::retained::OutputRetention;
use crate::sandbox_runtime::{CellInterrupt, RuntimeFuture, SandboxRuntime};

/// A spawner failure as the server answers it: a refused request is `refused`, anything else `Internal`.
fn spawner_failure(error: RuntimeError, refused: FailureKind) -> Failure {
    match error {
        RuntimeError::InvalidInput(message) => Failure::new(refused, message),
        error @ (RuntimeError::Runsc(_) | RuntimeError::TierFailed(_)) => {
            Failure::new(FailureKind::TierFailed, error.to_string())
        }
        other => Failure::new(FailureKind::Internal, other.to_string()),
    }
}

impl SandboxRuntime for LiveRuntime {
    fn tier_unavailable(&self, tier: Tier) -> Option<String> {
        if let Some(reason) = tier.unavailable_reason() {
            return Some(reason.to_owned());
        }
        match tier {
            Tier::Gvisor => self.runsc_missing(),
            Tier::Microvm => self.microvm_unusable(),
            _ => None,
        }
    }

    fn tier_accel(&self, tier: Tier) -> Option<sandkasten_types::MicrovmAccel> {
        (tier == Tier::Microvm).then(|| self.microvm_accel())
    }

    fn unhealthy(&self) -> Option<String> {
        self.spawner_down()
    }

    fn take_lost(&self) -> Vec<crate::sandbox_runtime::LostSandbox> {
        LiveRuntime::take_lost(self)
    }

    fn why_ended<'a>(&'a self, id: &'a str) -> RuntimeFuture<'a, Option<String>> {
        Box::pin(async move { Ok(LiveRuntime::why_ended(self, id).await) })
    }

    fn vm_boot(&self, id: &str) -> Option<crate::VmBoot> {
        LiveRuntime::vm_boot(self, id)
    }

    fn max_pids(&self) -> u64 {
        crate::host_pids::sandbox_pids_cap()
    }

    fn create<'a>(&'a self, id: &'a str, spec: &'a SandboxSpec) -> RuntimeFuture<'a, ()> {
        Box::pin(async move { self.spawn(id, spec).await.map_err(|e| spawner_failure(e, FailureKind::InvalidPath)) })
    }

    fn destroy<'a>(&'a self, id: &'a str) -> RuntimeFuture<'a, ()> {
        Box::pin(async move { self.remove(id).await.map(drop).map_err(|e| spawner_failure(e, FailureKind::NotFound)) })
    }

    fn usage<'a>(&'a self, id: &'a str) -> RuntimeFuture<'a, SandboxUsage> {
        Box::pin(self.usage(id))
    }

    fn set_paused<'a>(&'a self, id: &'a str, pause: bool) -> RuntimeFuture<'a, ()> {
        Box::pin(async move {
            self.set_paused(id, pause).await.map_err(|error| match error {
                // "not supported by this tier" and "no such sandbox" are the caller's to fix.
                RuntimeError::InvalidInput(message) => Failure::new(FailureKind::Conflict, message),
                other => spawner_failure(other, FailureKind::Conflict),
            })
        })
    }

    fn memory_snapshot<'a>(&'a self, id: &'a str, dir: &'a std::path::Path) -> RuntimeFuture<'a, ()> {
        Box::pin(
            async move { self.memory_snapshot(id, dir).await.map_err(|e| spawner_failure(e, FailureKind::Conflict)) },
        )
    }

    fn create_from_memory<'a>(
        &'a self,
        id: &'a str,
        spec: &'a SandboxSpec,
        dir: &'a std::path::Path,
    ) -> RuntimeFuture<'a, ()> {
        Box::pin(async move {
            self.spawn_from_memory(id, spec, dir).await.map_err(|e| spawner_failure(e, FailureKind::Conflict))
        })
    }

    fn is_alive(&self, id: &str) -> bool {
        self.running_agent(id).is_ok()
    }

    fn exec<'a>(
        &'a self,
        id: &'a str,
        spec: CommandSpec,
        output_limit: u64,
        events: mpsc::Sender<OutputChunk>,
    ) -> RuntimeFuture<'a, CommandExit> {
        Box::pin(self.run_command(id, spec, output_limit, events))
    }

    fn export_files<'a>(
        &'a self,
        id: &'a str,
        dirs: Vec<String>,
        sink: mpsc::Sender<Vec<u8>>,
    ) -> RuntimeFuture<'a, ()> {
        Box::pin(async move { super::archive::export_tar(&*self.file_agent(id)?, &dirs, sink).await })
    }

    fn import_files<'a>(&'a self, id: &'a str, source: mpsc::Receiver<Vec<u8>>) -> RuntimeFuture<'a, ()> {
        Box::pin(async move { super::archive::import_tar(&self.file_agent(id)?, source).await })
    }

    fn read_file_as<'a>(
        &'a self,
        id: &'a str,
        path: &'a str,
        max_bytes: u64,
        user: CommandUser,
    ) -> RuntimeFuture<'a, Vec<u8>> {
        Box::pin(async move { self.file_agent(id)?.read_file(path, max_bytes, user).await })
    }

    fn write_file_as<'a>(
        &'a self,
        id: &'a str,
        path: &'a str,
        data: Vec<u8>,
        user: CommandUser,
    ) -> RuntimeFuture<'a, ()> {
        Box::pin(async move { self.file_agent(id)?.write_file(path, &data, user).await })
    }

    fn list_dir_as<'a>(&'a self, id: &'a str, path: &'a str, user: CommandUser) -> RuntimeFuture<'a, Vec<FileInfo>> {
        Box::pin(async move { self.file_agent(id)?.list_dir(path, user).await })
    }

    fn stat_as<'a>(&'a self, id: &'a str, path: &'a str, user: CommandUser) -> RuntimeFuture<'a, FileInfo> {
        Box::pin(async move { self.file_agent(id)?.stat(path, user).await })
    }

    fn watch_dir<'a>(
        &'a self,
        id: &'a str,
        path: &'a str,
        recursive: bool,
        events: mpsc::Sender<Vec<FsEvent>>,
    ) -> RuntimeFuture<'a, ()> {
        Box::pin(async move { self.file_agent(id)?.watch(path, recursive, events).await })
    }

    fn open_port<'a>(&'a self, id: &'a str, port: u16) -> RuntimeFuture<'a, super::PortStream> {
        Box::pin(async move { self.file_agent(id)?.open_port(port).await })
    }

    fn mkdir_as<'a>(&'a self, id: &'a str, path: &'a str, parents: bool, user: CommandUser) -> RuntimeFuture<'a, ()> {
        Box::pin(async move { self.file_agent(id)?.mkdir(path, parents, user).await })
    }

    fn rename_as<'a>(&'a self, id: &'a str, from: &'a str, to: &'a str, user: CommandUser) -> RuntimeFuture<'a, ()> {
        Box::pin(async move { self.file_agent(id)?.rename(from, to, user).await })
    }

    fn remove_as<'a>(
        &'a self,
        id: &'a str,
        path: &'a str,
        recursive: bool,
        user: CommandUser,
    ) -> RuntimeFuture<'a, ()> {
        Box::pin(async move { self.file_agent(id)?.remove(path, recursive, user).await })
    }

    fn set_metadata<'a>(
        &'a self,
        id: &'a str,
        path: &'a str,
        metadata: FileMetadata,
        user: CommandUser,
    ) -> RuntimeFuture<'a, ()> {
        Box::pin(async move { self.file_agent(id)?.set_metadata(path, metadata, user).await })
    }

    fn create_context<'a>(
        &'a self,
        id: &'a str,
        language: CodeLanguage,
        cwd: Option<String>,
    ) -> RuntimeFuture<'a, ContextInfo> {
        Box::pin(async move {
            let host = self.kernel_host(id)?;
            self.contexts().create(&host, id, language, cwd).await
        })
    }

    fn prepare_context<'a>(
        &'a self,
        id: &'a str,
        language: CodeLanguage,
        preload: Vec<String>,
    ) -> RuntimeFuture<'a, ()> {
        Box::pin(async move {
            let host = self.kernel_host(id)?;
            self.contexts().prepare(&host, id, language, &preload).await
        })
    }

    fn discard_prepared_contexts<'a>(&'a self, id: &'a str) -> RuntimeFuture<'a, ()> {
        Box::pin(async move {
            self.contexts().discard_spares(id).await;
            Ok(())
        })
    }

    fn list_contexts<'a>(&'a self, id: &'a str) -> RuntimeFuture<'a, Vec<ContextInfo>> {
        Box::pin(async move {
            self.running_agent(id)?;
            Ok(self.contexts().list(id))
        })
    }

    fn remove_context<'a>(&'a self, id: &'a str, context: &'a str) -> RuntimeFuture<'a, ()> {
        Box::pin(async move {
            self.running_agent(id)?;
            self.contexts().remove(id, context).await
        })
    }

    fn restart_context<'a>(&'a self, id: &'a str, context: &'a str) -> RuntimeFuture<'a, ContextInfo> {
        Box::pin(async move {
            let host = self.kernel_host(id)?;
            self.contexts().restart(&host, id, context).await
        })
    }

    fn run_code<'a>(
        &'a self,
        id: &'a str,
        request: CodeRun,
        events: mpsc::Sender<OutputChunk>,
        interrupt: Option<CellInterrupt>,
    ) -> RuntimeFuture<'a, CellOutcome> {
        Box::pin(async move {
            let host = self.kernel_host(id)?;
            let outcome = self.contexts().run(&host, id, request, events, interrupt).await;
            if !self.is_alive(id) {
                // Killed or ended during the cell: that, not the lost interpreter, is the answer.
                return Err(sandbox_gone());
            }
            outcome
        })
    }

    fn start_command<'a>(
        &'a self,
        id: &'a str,
        command_id: &'a str,
        spec: CommandSpec,
        retention: OutputRetention,
    ) -> RuntimeFuture<'a, CommandStatus> {
        Box::pin(async move {
            let (agent, cgroup) = self.running_agent_and_cgroup(id)?;
            let status = self.commands().start(&agent, cgroup, id, command_id, spec, retention).await?;
            if !self.is_alive(id) {
                // Destroyed while the command started: do not keep it.
                self.commands().forget(id);
                return Err(sandbox_gone());
            }
            Ok(status)
        })
    }

    fn list_commands<'a>(&'a self, id: &'a str) -> RuntimeFuture<'a, Vec<CommandStatus>> {
        Box::pin(async move {
            self.running_agent(id)?;
            Ok(self.commands().list(id))
        })
    }

    fn stream_command<'a>(
        &'a self,
        id: &'a str,
        command_id: &'a str,
        offset: u64,
    ) -> RuntimeFuture<'a, mpsc::Receiver<CommandEvent>> {
        Box::pin(async move {
            self.running_agent(id)?;
            self.commands().stream(id, command_id, offset)
        })
    }

    fn command_stdin<'a>(
        &'a self,
        id: &'a str,
        command_id: &'a str,
        data: Vec<u8>,
        eof: bool,
    ) -> RuntimeFuture<'a, ()> {
        Box::pin(async move {
            self.running_agent(id)?;
            self.commands().stdin(id, command_id, &data, eof).await
        })
    }

    fn signal_command<'a>(&'a self, id: &'a str, command_id: &'a str, signal: i32) -> RuntimeFuture<'a, ()> {
        Box::pin(async move {
            self.running_agent(id)?;
            if signal == libc::SIGKILL {
                // SIGKILL on an ended command is a no-op.
                return self.commands().kill(id, command_id).await;
            }
            self.commands().signal(id, command_id, signal).await
        })
    }

    fn resize_command<'a>(&'a self, id: &'a str, command_id: &'a str, size: PtySize) -> RuntimeFuture<'a, ()> {
        Box::pin(async move {
            self.running_agent(id)?;
            self.commands().resize(id, command_id, size).await
        })
    }

    fn listen_in_sandbox(&self, id: &str, port: u16) -> Result<Entrance, Failure> {
        match self.listen(id, port) {
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
}
