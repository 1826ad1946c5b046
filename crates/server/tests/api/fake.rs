//! An in-memory `SandboxRuntime` for the API tests: files live in maps, and a few made-up programs stand in for real
//! commands: `echo ARGS…` prints, `sleep-ms N` waits, `steps out:TEXT err:TEXT sleep:MS exit:N …` runs a script,
//! `bytes N` prints N bytes, `timeout` is killed at its timeout; anything else exits 127. Code contexts are counters:
//! a cell `print:TEXT` writes TEXT, `raise` raises, `hang` runs to its timeout and is interrupted, anything else is
//! its own `text/plain` result. Background commands live in `fake_commands.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use sandkasten_runtime::{CellInterrupt, OutputRetention, RuntimeFuture, SandboxRuntime};
use sandkasten_types::{
    CellError, CellOutcome, CellResult, CodeLanguage, CodeRun, CommandEvent, CommandExit, CommandSpec, CommandStatus,
    CommandUser, ContextInfo, Failure, FailureKind, FileInfo, FileKind, OutputChunk, PtySize, SandboxSpec, StreamKind,
    Tier,
};
use tokio::sync::mpsc;

#[derive(Default)]
struct FakeSandbox {
    files: BTreeMap<String, Vec<u8>>,
    dirs: BTreeSet<String>,
    contexts: BTreeMap<String, ContextInfo>,
}

/// The fake runtime.
#[derive(Default)]
pub(crate) struct FakeRuntime {
    sandboxes: Mutex<HashMap<String, FakeSandbox>>,
    /// When set, `create` fails.
    pub(crate) fail_create: AtomicBool,
    /// `usage` calls so far (each reading adds 10 ms of CPU time).
    usage_readings: AtomicUsize,
    /// Tiers this "host" cannot run, with what `tier_unavailable` says (besides what the build cannot run).
    pub(crate) unavailable_tiers: Mutex<HashMap<Tier, String>>,
    /// How this "host" runs microVMs (`tier_accel`, and `vm_boot` of each microvm sandbox); `None`: as TCG.
    pub(crate) microvm_accel: Mutex<Option<sandkasten_types::MicrovmAccel>>,
    /// When each microVM sandbox's (pretend) VMM was launched and its guest booted (CLOCK_MONOTONIC ns).
    pub(crate) vm_boots: Mutex<std::collections::HashMap<String, (u64, u64)>>,
    /// Every `create` call (pool members included), in order: the id and the spec.
    pub(crate) created: Mutex<Vec<(String, SandboxSpec)>>,
    /// Commands that ran to their end.
    pub(crate) finished_commands: AtomicUsize,
    /// The last command spec received.
    pub(crate) last_command: Mutex<Option<CommandSpec>>,
    /// Background commands.
    pub(crate) commands: crate::fake_commands::FakeCommands,
    /// Spare kernels prepared (`prepare_context`) and not discarded: sandbox id → language and preload.
    pub(crate) spares: Mutex<HashMap<String, (CodeLanguage, Vec<String>)>>,
    /// Sandboxes whose spare kernels were discarded, in order.
    pub(crate) discarded: Mutex<Vec<String>>,
    /// `hang` cells their caller interrupted.
    pub(crate) interrupted_cells: AtomicUsize,
    /// Who the last file read acted as.
    pub(crate) last_read_user: Mutex<Option<CommandUser>>,
    /// What `unhealthy` says (a failed part of the runtime).
    pub(crate) unhealthy: Mutex<Option<String>>,
    /// Sandboxes that died on their own, for `take_lost`.
    pub(crate) lost: Mutex<Vec<sandkasten_runtime::LostSandbox>>,
}

fn failure(kind: FailureKind, message: impl Into<String>) -> Failure {
    Failure::new(kind, message)
}

fn parent(path: &str) -> String {
    match path.trim_end_matches('/').rsplit_once('/') {
        Some(("", _)) | None => "/".into(),
        Some((parent, _)) => parent.into(),
    }
}

fn info(path: &str, kind: FileKind, size: u64) -> FileInfo {
    FileInfo {
        name: path.rsplit('/').next().unwrap_or_default().into(),
        path: path.into(),
        kind,
        size,
        mode: if kind == FileKind::Dir { 0o755 } else { 0o644 },
        modified_unix_ms: 0,
        symlink_target: None,
        uid: 1000,
        gid: 1000,
        metadata: Default::default(),
    }
}

impl FakeRuntime {
    /// Whether the runtime holds sandbox `id` now.
    pub(crate) fn is_alive_here(&self, id: &str) -> bool {
        self.sandboxes.lock().unwrap().contains_key(id)
    }

    /// The tier each `create` call was given (`None` when the server left it unset, which it must not).
    pub(crate) fn created_tiers(&self) -> Vec<Option<Tier>> {
        self.created.lock().unwrap().iter().map(|(_, spec)| spec.isolation).collect()
    }

    /// Ids of the sandboxes that exist.
    pub(crate) fn ids(&self) -> BTreeSet<String> {
        self.sandboxes.lock().unwrap().keys().cloned().collect()
    }

    /// The files (path → bytes) and directories of sandbox `id`, to check that a request wrote nothing.
    pub(crate) fn tree(&self, id: &str) -> (BTreeMap<String, Vec<u8>>, BTreeSet<String>) {
        let sandboxes = self.sandboxes.lock().unwrap();
        let sandbox = &sandboxes[id];
        (sandbox.files.clone(), sandbox.dirs.clone())
    }

    /// Makes a sandbox vanish as if its processes died.
    pub(crate) fn kill(&self, id: &str) {
        self.sandboxes.lock().unwrap().remove(id);
        self.commands.forget(id);
    }

    fn with<T>(&self, id: &str, f: impl FnOnce(&mut FakeSandbox) -> Result<T, Failure>) -> Result<T, Failure> {
        let mut sandboxes = self.sandboxes.lock().unwrap();
        let sandbox =
            sandboxes.get_mut(id).ok_or_else(|| failure(FailureKind::SandboxGone, format!("{id} is gone")))?;
        f(sandbox)
    }
}

async fn send(events: &mpsc::Sender<OutputChunk>, stream: StreamKind, text: &[u8]) {
    events.send(OutputChunk { stream, data: text.to_vec() }).await.ok();
}

impl SandboxRuntime for FakeRuntime {
    fn unhealthy(&self) -> Option<String> {
        self.unhealthy.lock().unwrap().clone()
    }

    fn take_lost(&self) -> Vec<sandkasten_runtime::LostSandbox> {
        std::mem::take(&mut *self.lost.lock().unwrap())
    }

    fn tier_unavailable(&self, tier: Tier) -> Option<String> {
        let own = self.unavailable_tiers.lock().unwrap().get(&tier).cloned();
        own.or_else(|| tier.unavailable_reason().map(str::to_owned))
    }

    fn tier_accel(&self, tier: Tier) -> Option<sandkasten_types::MicrovmAccel> {
        let accel = self.microvm_accel.lock().unwrap().unwrap_or(sandkasten_types::MicrovmAccel::Tcg);
        (tier == Tier::Microvm).then_some(accel)
    }

    fn vm_boot(&self, id: &str) -> Option<sandkasten_runtime::VmBoot> {
        let created = self.created.lock().unwrap();
        let (_, spec) = created.iter().rev().find(|(created, _)| created == id)?;
        let accel = self.tier_accel(spec.tier())?;
        let (launched_ns, booted_ns) = *self.vm_boots.lock().unwrap().get(id)?;
        Some(sandkasten_runtime::VmBoot { accel, booted_ns, launched_ns })
    }

    fn create<'a>(&'a self, id: &'a str, spec: &'a SandboxSpec) -> RuntimeFuture<'a, ()> {
        Box::pin(async move {
            self.created.lock().unwrap().push((id.to_owned(), spec.clone()));
            if spec.tier() == Tier::Microvm {
                // A boot of 5 ms.
                let launched_ns = sandkasten_runtime::monotonic_ns();
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                let boot = (launched_ns, sandkasten_runtime::monotonic_ns());
                self.vm_boots.lock().unwrap().insert(id.to_owned(), boot);
            }
            if self.fail_create.load(Ordering::SeqCst) {
                return Err(failure(FailureKind::Internal, "fake create failure"));
            }
            let dirs = ["/", "/workspace", "/tmp"].into_iter().map(String::from).collect();
            self.sandboxes
                .lock()
                .unwrap()
                .insert(id.into(), FakeSandbox { files: BTreeMap::new(), dirs, contexts: BTreeMap::new() });
            Ok(())
        })
    }

    fn destroy<'a>(&'a self, id: &'a str) -> RuntimeFuture<'a, ()> {
        Box::pin(async move {
            self.commands.forget(id);
            match self.sandboxes.lock().unwrap().remove(id) {
                Some(_) => Ok(()),
                None => Err(failure(FailureKind::NotFound, format!("{id} not found"))),
            }
        })
    }

    fn is_alive(&self, id: &str) -> bool {
        self.sandboxes.lock().unwrap().contains_key(id)
    }

    /// No namespaces here: the "inside" port is an ephemeral one on the host's loopback.
    fn listen_in_sandbox(&self, id: &str, _port: u16) -> Result<sandkasten_types::Entrance, Failure> {
        self.with(id, |_| Ok(()))?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        Ok(sandkasten_types::Entrance::Tcp(listener))
    }

    /// CPU time grows by 10 ms per reading; the memory held is 1 MiB plus the files' bytes, which are the disk use.
    fn usage<'a>(&'a self, id: &'a str) -> RuntimeFuture<'a, sandkasten_types::SandboxUsage> {
        Box::pin(async move {
            let readings = self.usage_readings.fetch_add(1, Ordering::SeqCst) as u64 + 1;
            let stored = self.with(id, |sb| Ok(sb.files.values().map(|data| data.len() as u64).sum::<u64>()))?;
            Ok(sandkasten_types::SandboxUsage {
                cpu_ns: readings * 10_000_000,
                memory_used_bytes: (1 << 20) + stored,
                memory_cache_bytes: 4096,
                disk: sandkasten_types::DiskUsage { used_bytes: stored, total_bytes: 128 << 20 },
            })
        })
    }

    fn set_paused<'a>(&'a self, id: &'a str, _pause: bool) -> RuntimeFuture<'a, ()> {
        Box::pin(async move { self.with(id, |_| Ok(())) })
    }

    fn exec<'a>(
        &'a self,
        id: &'a str,
        spec: CommandSpec,
        _output_limit: u64,
        events: mpsc::Sender<OutputChunk>,
    ) -> RuntimeFuture<'a, CommandExit> {
        Box::pin(async move {
            self.with(id, |_| Ok(()))?;
            *self.last_command.lock().unwrap() = Some(spec.clone());
            let argv = spec.resolved_argv().map_err(|e| failure(FailureKind::ExecFailed, e))?;
            let exit = |code| {
                Ok(CommandExit { exit_code: Some(code), signal: None, timed_out: false, ..CommandExit::default() })
            };
            let result = match argv[0].as_str() {
                "echo" => {
                    send(&events, StreamKind::Stdout, format!("{}\n", argv[1..].join(" ")).as_bytes()).await;
                    exit(0)
                }
                "sleep-ms" => {
                    let ms: u64 = argv.get(1).and_then(|a| a.parse().ok()).unwrap_or(0);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    exit(0)
                }
                "timeout" => {
                    Ok(CommandExit { exit_code: None, signal: Some(9), timed_out: true, ..CommandExit::default() })
                }
                "bytes" => {
                    let n: usize = argv.get(1).and_then(|a| a.parse().ok()).unwrap_or(0);
                    send(&events, StreamKind::Stdout, &vec![b'x'; n]).await;
                    exit(0)
                }
                "steps" => {
                    let mut code = 0;
                    for step in &argv[1..] {
                        let (op, arg) = step.split_once(':').unwrap_or((step, ""));
                        match op {
                            "out" => send(&events, StreamKind::Stdout, arg.as_bytes()).await,
                            "err" => send(&events, StreamKind::Stderr, arg.as_bytes()).await,
                            "raw" => send(&events, StreamKind::Stdout, &[0xff, 0xfe]).await,
                            "sleep" => tokio::time::sleep(Duration::from_millis(arg.parse().unwrap_or(0))).await,
                            "exit" => code = arg.parse().unwrap_or(1),
                            "gone" => {
                                self.kill(id);
                                return Err(failure(FailureKind::SandboxGone, "the sandbox died"));
                            }
                            _ => {}
                        }
                    }
                    exit(code)
                }
                other => {
                    send(&events, StreamKind::Stderr, format!("{other}: command not found\n").as_bytes()).await;
                    exit(127)
                }
            };
            self.finished_commands.fetch_add(1, Ordering::SeqCst);
            result
        })
    }

    fn export_files<'a>(
        &'a self,
        id: &'a str,
        dirs: Vec<String>,
        sink: mpsc::Sender<Vec<u8>>,
    ) -> RuntimeFuture<'a, ()> {
        Box::pin(async move {
            let archive = self.with(id, |sb| {
                let under = |path: &str| dirs.iter().any(|d| path.starts_with(&format!("{d}/")));
                let mut builder = tar::Builder::new(Vec::new());
                for dir in sb.dirs.iter().filter(|d| under(d)) {
                    let mut header = tar::Header::new_gnu();
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(0o755);
                    header.set_size(0);
                    builder.append_data(&mut header, dir.trim_start_matches('/'), std::io::empty()).unwrap();
                }
                for (path, data) in sb.files.iter().filter(|(p, _)| under(p)) {
                    let mut header = tar::Header::new_gnu();
                    header.set_mode(0o644);
                    header.set_size(data.len() as u64);
                    builder.append_data(&mut header, path.trim_start_matches('/'), data.as_slice()).unwrap();
                }
                Ok(builder.into_inner().unwrap())
            })?;
            for piece in archive.chunks(1024) {
                sink.send(piece.to_vec()).await.map_err(|_| failure(FailureKind::Internal, "the reader went away"))?;
            }
            Ok(())
        })
    }

    fn import_files<'a>(&'a self, id: &'a str, mut source: mpsc::Receiver<Vec<u8>>) -> RuntimeFuture<'a, ()> {
        Box::pin(async move {
            let mut archive = Vec::new();
            while let Some(piece) = source.recv().await {
                archive.extend_from_slice(&piece);
            }
            let mut entries = Vec::new();
            let mut reader = tar::Archive::new(archive.as_slice());
            let parsed = reader.entries().and_then(|all| {
                for entry in all {
                    let mut entry = entry?;
                    let path = format!("/{}", entry.path()?.display()).trim_end_matches('/').to_owned();
                    let mut data = Vec::new();
                    std::io::Read::read_to_end(&mut entry, &mut data)?;
                    entries.push((path, entry.header().entry_type().is_dir(), data));
                }
                Ok(())
            });
            parsed.map_err(|e| failure(FailureKind::Conflict, format!("tar: {e}")))?;
            self.with(id, |sb| {
                for (path, is_dir, data) in entries {
                    if is_dir {
                        sb.dirs.insert(path);
                    } else {
                        sb.files.insert(path, data);
                    }
                }
                Ok(())
            })
        })
    }

    fn read_file_as<'a>(
        &'a self,
        id: &'a str,
        path: &'a str,
        max_bytes: u64,
        user: CommandUser,
    ) -> RuntimeFuture<'a, Vec<u8>> {
        *self.last_read_user.lock().unwrap() = Some(user);
        Box::pin(async move {
            self.with(id, |sb| {
                if sb.dirs.contains(path) {
                    return Err(failure(FailureKind::IsADirectory, format!("{path} is a directory")));
                }
                let data =
                    sb.files.get(path).ok_or_else(|| failure(FailureKind::NotFound, format!("{path} not found")))?;
                if data.len() as u64 > max_bytes {
                    return Err(failure(FailureKind::TooLarge, format!("{path} is larger than {max_bytes} bytes")));
                }
                Ok(data.clone())
            })
        })
    }

    fn write_file_as<'a>(
        &'a self,
        id: &'a str,
        path: &'a str,
        data: Vec<u8>,
        _user: CommandUser,
    ) -> RuntimeFuture<'a, ()> {
        Box::pin(async move {
            self.with(id, |sb| {
                if sb.dirs.contains(path) {
                    return Err(failure(FailureKind::IsADirectory, format!("{path} is a directory")));
                }
                if !sb.dirs.contains(&parent(path)) {
                    return Err(failure(FailureKind::NotFound, format!("the directory of {path} does not exist")));
                }
                sb.files.insert(path.into(), data);
                Ok(())
            })
        })
    }

    fn list_dir_as<'a>(&'a self, id: &'a str, path: &'a str, _user: CommandUser) -> RuntimeFuture<'a, Vec<FileInfo>> {
        Box::pin(async move {
            self.with(id, |sb| {
                if sb.files.contains_key(path) {
                    return Err(failure(FailureKind::NotADirectory, format!("{path} is not a directory")));
                }
                if !sb.dirs.contains(path) {
                    return Err(failure(FailureKind::NotFound, format!("{path} not found")));
                }
                let dirs = sb.dirs.iter().filter(|d| *d != "/" && parent(d) == path).map(|d| info(d, FileKind::Dir, 0));
                let files = sb
                    .files
                    .iter()
                    .filter(|(f, _)| parent(f) == path)
                    .map(|(f, d)| info(f, FileKind::File, d.len() as u64));
                Ok(dirs.chain(files).collect())
            })
        })
    }

    fn stat_as<'a>(&'a self, id: &'a str, path: &'a str, _user: CommandUser) -> RuntimeFuture<'a, FileInfo> {
        Box::pin(async move {
            self.with(id, |sb| {
                if sb.dirs.contains(path) {
                    return Ok(info(path, FileKind::Dir, 0));
                }
                let data =
                    sb.files.get(path).ok_or_else(|| failure(FailureKind::NotFound, format!("{path} not found")))?;
                Ok(info(path, FileKind::File, data.len() as u64))
            })
        })
    }

    fn mkdir_as<'a>(&'a self, id: &'a str, path: &'a str, parents: bool, _user: CommandUser) -> RuntimeFuture<'a, ()> {
        Box::pin(async move {
            self.with(id, |sb| {
                if sb.files.contains_key(path) || (sb.dirs.contains(path) && !parents) {
                    return Err(failure(FailureKind::AlreadyExists, format!("{path} exists")));
                }
                if !parents && !sb.dirs.contains(&parent(path)) {
                    return Err(failure(FailureKind::NotFound, format!("the parent of {path} does not exist")));
                }
                let mut current = path.to_owned();
                while current != "/" {
                    sb.dirs.insert(current.clone());
                    current = parent(&current);
                }
                Ok(())
            })
        })
    }

    fn rename_as<'a>(&'a self, id: &'a str, from: &'a str, to: &'a str, _user: CommandUser) -> RuntimeFuture<'a, ()> {
        Box::pin(async move {
            self.with(id, |sb| {
                if let Some(data) = sb.files.remove(from) {
                    sb.files.insert(to.into(), data);
                    return Ok(());
                }
                if !sb.dirs.remove(from) {
                    return Err(failure(FailureKind::NotFound, format!("{from} not found")));
                }
                sb.dirs.insert(to.into());
                Ok(())
            })
        })
    }

    fn set_metadata<'a>(
        &'a self,
        id: &'a str,
        path: &'a str,
        _metadata: sandkasten_types::FileMetadata,
        _user: CommandUser,
    ) -> RuntimeFuture<'a, ()> {
        Box::pin(async move {
            self.with(id, |sb| match sb.dirs.contains(path) || sb.files.contains_key(path) {
                true => Ok(()),
                false => Err(failure(FailureKind::NotFound, format!("{path} not found"))),
            })
        })
    }

    fn remove_as<'a>(
        &'a self,
        id: &'a str,
        path: &'a str,
        recursive: bool,
        _user: CommandUser,
    ) -> RuntimeFuture<'a, ()> {
        Box::pin(async move {
            self.with(id, |sb| {
                if sb.files.remove(path).is_some() {
                    return Ok(());
                }
                if !sb.dirs.contains(path) {
                    return Err(failure(FailureKind::NotFound, format!("{path} not found")));
                }
                let prefix = format!("{path}/");
                let has_children =
                    sb.files.keys().any(|f| f.starts_with(&prefix)) || sb.dirs.iter().any(|d| d.starts_with(&prefix));
                if has_children && !recursive {
                    return Err(failure(FailureKind::NotEmpty, format!("{path} is not empty")));
                }
                sb.files.retain(|f, _| !f.starts_with(&prefix));
                sb.dirs.retain(|d| d != path && !d.starts_with(&prefix));
                Ok(())
            })
        })
    }

    fn create_context<'a>(
        &'a self,
        id: &'a str,
        language: CodeLanguage,
        cwd: Option<String>,
    ) -> RuntimeFuture<'a, ContextInfo> {
        Box::pin(async move {
            self.with(id, |sb| {
                let context_id = format!("ctx-{:016x}", sb.contexts.len() + 1);
                let info = ContextInfo { id: context_id.clone(), language, default: false, execution_count: 0, cwd };
                sb.contexts.insert(context_id, info.clone());
                Ok(info)
            })
        })
    }

    fn prepare_context<'a>(
        &'a self,
        id: &'a str,
        language: CodeLanguage,
        preload: Vec<String>,
    ) -> RuntimeFuture<'a, ()> {
        Box::pin(async move {
            self.with(id, |_| Ok(()))?;
            self.spares.lock().unwrap().insert(id.to_owned(), (language, preload));
            Ok(())
        })
    }

    fn discard_prepared_contexts<'a>(&'a self, id: &'a str) -> RuntimeFuture<'a, ()> {
        Box::pin(async move {
            if self.spares.lock().unwrap().remove(id).is_some() {
                self.discarded.lock().unwrap().push(id.to_owned());
            }
            Ok(())
        })
    }

    fn list_contexts<'a>(&'a self, id: &'a str) -> RuntimeFuture<'a, Vec<ContextInfo>> {
        Box::pin(async move { self.with(id, |sb| Ok(sb.contexts.values().cloned().collect())) })
    }

    fn remove_context<'a>(&'a self, id: &'a str, context: &'a str) -> RuntimeFuture<'a, ()> {
        Box::pin(async move {
            self.with(id, |sb| match sb.contexts.remove(context) {
                Some(_) => Ok(()),
                None => Err(failure(FailureKind::NotFound, format!("no code context {context}"))),
            })
        })
    }

    fn restart_context<'a>(&'a self, id: &'a str, context: &'a str) -> RuntimeFuture<'a, ContextInfo> {
        Box::pin(async move {
            self.with(id, |sb| match sb.contexts.get_mut(context) {
                Some(info) => {
                    info.execution_count = 0;
                    Ok(info.clone())
                }
                None => Err(failure(FailureKind::NotFound, format!("no code context {context}"))),
            })
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
            let info = self.with(id, |sb| {
                let key = match (&request.context_id, request.language) {
                    (Some(context), _) => context.clone(),
                    (None, Some(language)) => {
                        let found = sb.contexts.values().find(|c| c.default && c.language == language);
                        match found {
                            Some(info) => info.id.clone(),
                            None => {
                                let key = format!("ctx-{:016x}", 0xd000 + sb.contexts.len());
                                let info = ContextInfo {
                                    id: key.clone(),
                                    language,
                                    default: true,
                                    execution_count: 0,
                                    cwd: None,
                                };
                                sb.contexts.insert(key.clone(), info);
                                key
                            }
                        }
                    }
                    (None, None) => return Err(failure(FailureKind::Internal, "no language and no context")),
                };
                let info = sb
                    .contexts
                    .get_mut(&key)
                    .ok_or_else(|| failure(FailureKind::NotFound, format!("no code context {key}")))?;
                if request.language.is_some_and(|language| language != info.language) {
                    return Err(failure(FailureKind::ExecFailed, format!("context {key} runs another language")));
                }
                info.execution_count += 1;
                Ok(info.clone())
            })?;
            let mut outcome =
                CellOutcome { context_id: info.id, execution_count: info.execution_count, ..CellOutcome::default() };
            if let Some(text) = request.code.strip_prefix("print:") {
                send(&events, StreamKind::Stdout, text.as_bytes()).await;
                outcome.stdout = text.to_owned();
            } else if let Some(name) = request.code.strip_prefix("env:") {
                let value = request.env.get(name).cloned().unwrap_or_else(|| "(unset)".to_owned());
                let result = CellResult { text_plain: Some(value), is_main_result: true, ..CellResult::default() };
                outcome.results.push(result);
            } else if request.code == "hang" {
                // Until its timeout, or until the caller interrupts it (counted in `interrupted_cells`).
                let sleep = tokio::time::sleep(Duration::from_millis(request.timeout_ms));
                let fired = async {
                    match interrupt {
                        Some(receiver) => receiver.await.is_ok(),
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = sleep => {}
                    true = fired => {
                        self.interrupted_cells.fetch_add(1, Ordering::SeqCst);
                    }
                }
                outcome.error =
                    Some(CellError { name: "KeyboardInterrupt".into(), value: String::new(), traceback: Vec::new() });
            } else if request.code == "raise" {
                let traceback = vec!["Traceback (most recent call last):".into(), "ValueError: raised".into()];
                outcome.error = Some(CellError { name: "ValueError".into(), value: "raised".into(), traceback });
            } else {
                let result =
                    CellResult { text_plain: Some(request.code), is_main_result: true, ..CellResult::default() };
                outcome.results.push(result);
            }
            Ok(outcome)
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
            self.with(id, |_| Ok(()))?;
            *self.last_command.lock().unwrap() = Some(spec.clone());
            self.commands.start(id, command_id, spec, retention.per_stream)
        })
    }

    fn list_commands<'a>(&'a self, id: &'a str) -> RuntimeFuture<'a, Vec<CommandStatus>> {
        Box::pin(async move {
            self.with(id, |_| Ok(()))?;
            Ok(self.commands.list(id))
        })
    }

    fn stream_command<'a>(
        &'a self,
        id: &'a str,
        command_id: &'a str,
        offset: u64,
    ) -> RuntimeFuture<'a, mpsc::Receiver<CommandEvent>> {
        Box::pin(async move {
            self.with(id, |_| Ok(()))?;
            self.commands.stream(id, command_id, offset)
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
            self.with(id, |_| Ok(()))?;
            self.commands.stdin(id, command_id, data, eof)
        })
    }

    fn signal_command<'a>(&'a self, id: &'a str, command_id: &'a str, signal: i32) -> RuntimeFuture<'a, ()> {
        Box::pin(async move {
            self.with(id, |_| Ok(()))?;
            self.commands.signal(id, command_id, signal)
        })
    }

    fn resize_command<'a>(&'a self, id: &'a str, command_id: &'a str, size: PtySize) -> RuntimeFuture<'a, ()> {
        Box::pin(async move {
            self.with(id, |_| Ok(()))?;
            self.commands.resize(id, command_id, size)
        })
    }
}
