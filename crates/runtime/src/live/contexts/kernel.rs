//! One running kernel: a background command in the sandbox (started by the agent as the sandbox user, jailed like
//! every command) that reads one JSON request per line on stdin and answers on stdout (see `wire.rs` and
//! `resources/kernels/`). Runs one cell at a time: sends it, forwards its output, and at the timeout interrupts it
//! (SIGINT); a kernel that does not answer within the grace period after that is killed. Its events are drained as
//! they come into a bounded queue (`QUEUED_EVENTS`): output nobody reads (between cells) is dropped, not held.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sandkasten_types::{CellError, CodeLanguage, CommandExit, CommandSpec, Failure, OutputChunk, StreamKind};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::KernelHost;
use super::error;
use super::wire::{KernelMessage, Line, LineSplitter, Reply};
use crate::live::agent_client::sandbox_gone;
use crate::live::background::{BackgroundCommand, BackgroundEvent};
use crate::sandbox_runtime::CellInterrupt;

/// The Python kernel's source (run with `python3 -c`): the chart reader, then the kernel.
pub const PYTHON_KERNEL: &str = concat!(
    include_str!("../../../../../resources/kernels/python_charts.py"),
    include_str!("../../../../../resources/kernels/python_kernel.py")
);
/// The JavaScript kernel's source (run with `node -e`).
pub const NODE_KERNEL: &str = include_str!("../../../../../resources/kernels/node_kernel.js");
/// The bash kernel's source (run with `python3 -c`; it drives one `bash`).
pub const BASH_KERNEL: &str = include_str!("../../../../../resources/kernels/bash_kernel.py");
/// The R kernel's source (run with `python3 -c`; it drives one `R` session).
pub const R_KERNEL: &str = include_str!("../../../../../resources/kernels/r_kernel.py");
/// The Java kernel's source (run by the JDK's source-file mode, see `JAVA_LAUNCHER`).
pub const JAVA_KERNEL: &str = include_str!("../../../../../resources/kernels/JavaKernel.java");

/// Starts the Java kernel: `java` compiles a source file it is given by path (it reads it twice, so not a pipe), so the
/// launcher writes its first argument to a temporary file, opens it on fd 3, removes it and runs `java` on
/// `/proc/self/fd/3`: no file is left in the sandbox. The JVM is sized for a REPL in a sandbox of `$2` bytes
/// (`MaxRAM`: no tier shows the JVM its cgroup, and `/proc/meminfo` is the host's, so without it the heap would be
/// sized by the host's memory), with the serial collector (one GC thread), the first JIT tier only and no
/// `/tmp/hsperfdata_*`; `java.util` is opened to the kernel, which sets a cell's `env` in the JVM's environment map.
const JAVA_LAUNCHER: &str = "source=$(mktemp \"${TMPDIR:-/tmp}/sandkasten-java-kernel.XXXXXX\") \
    && printf '%s' \"$1\" >\"$source\" && exec 3<\"$source\" && rm -f \"$source\" \
    && exec java -XX:MaxRAM=\"$2\" -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData -Xshare:auto \
    --add-opens=java.base/java.util=ALL-UNNAMED --source 17 /proc/self/fd/3";

/// How long a kernel may take to start (a spare kernel: with importing its preload modules).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a kernel may take to start on an emulated CPU (a microVM under TCG): the JVM's start, with jshell's
/// compiler, takes about 40 s there against 2 s on the host's CPU.
const EMULATED_START_TIMEOUT: Duration = Duration::from_secs(180);

/// How long a kernel in `host`'s sandbox may take to start.
fn start_timeout(host: &KernelHost) -> Duration {
    if host.emulated { EMULATED_START_TIMEOUT } else { START_TIMEOUT }
}
/// How long an interrupted cell has to answer before the kernel is killed.
const INTERRUPT_GRACE: Duration = Duration::from_secs(3);
/// Most bytes of a failed start's stderr kept for the error message.
const START_STDERR_BYTES: usize = 4096;

/// What to send a cell's output to, as it arrives (each chunk's bytes are whole UTF-8 characters).
pub type CellOutput = mpsc::Sender<OutputChunk>;

/// One cell as a kernel runs it.
#[derive(Debug, Clone, Copy)]
pub struct Cell<'a> {
    /// Its source.
    pub code: &'a str,
    /// Environment variables for this cell only (the kernel puts them back after it).
    pub env: &'a BTreeMap<String, String>,
    /// When to interrupt it.
    pub timeout: Duration,
    /// Most bytes kept per output stream.
    pub limit: usize,
}

/// The command that runs a kernel of `language`, importing (Python) or requiring (Node) the `preload` modules before
/// it reports ready (Java and R ignore them), in `cwd` (`None`: the sandbox's default working directory), in a
/// sandbox of `memory_bytes` (the JVM sizes its heap by it, as by a container's limit: at most a quarter).
pub fn kernel_command(language: CodeLanguage, preload: &[String], cwd: Option<&str>, memory_bytes: u64) -> CommandSpec {
    let head: &[&str] = match language {
        CodeLanguage::Python => &["python3", "-c", PYTHON_KERNEL],
        CodeLanguage::Javascript | CodeLanguage::Typescript => &["node", "-e", NODE_KERNEL],
        CodeLanguage::Bash => &["python3", "-c", BASH_KERNEL],
        CodeLanguage::R => &["python3", "-c", R_KERNEL],
        // The kernel is the launcher's `$1`, the memory its `$2`; Java has nothing to preload.
        CodeLanguage::Java => &["bash", "-c", JAVA_LAUNCHER, "sandkasten-java-kernel", JAVA_KERNEL],
    };
    let tail = match language {
        CodeLanguage::Java => vec![memory_bytes.to_string()],
        // The R kernel has nothing to preload.
        CodeLanguage::R => Vec::new(),
        _ => preload.to_vec(),
    };
    let argv = head.iter().copied().map(str::to_owned).chain(tail).collect();
    let mut env: BTreeMap<String, String> =
        [("PYTHONDONTWRITEBYTECODE", "1"), ("MPLBACKEND", "Agg"), ("NODE_NO_WARNINGS", "1")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
    // The JavaScript kernel transpiles every cell first (`resources/kernels/node_kernel.js`).
    if language == CodeLanguage::Typescript {
        env.insert("SANDKASTEN_KERNEL_LANGUAGE".to_owned(), "typescript".to_owned());
    }
    CommandSpec { argv: Some(argv), env, cwd: cwd.map(str::to_owned), ..CommandSpec::default() }
}

/// How a cell ended, before it becomes a `CellOutcome`.
#[derive(Debug, Default)]
pub struct CellRun {
    /// Captured standard output (at most the limit).
    pub stdout: String,
    /// Captured standard error.
    pub stderr: String,
    /// Output was cut at the limit.
    pub truncated: bool,
    /// The kernel's reply, or the error the host made up (timeout, the kernel died).
    pub reply: Option<Reply>,
    /// The host's own error, when there is no reply.
    pub host_error: Option<CellError>,
    /// The kernel is unusable (killed or died): the caller restarts it.
    pub kernel_lost: bool,
}

impl CellRun {
    fn keep(&mut self, stream: StreamKind, text: &str, limit: usize) -> Option<String> {
        let target = match stream {
            StreamKind::Stdout => &mut self.stdout,
            StreamKind::Stderr => &mut self.stderr,
        };
        let room = limit.saturating_sub(target.len());
        if room == 0 {
            self.truncated |= !text.is_empty();
            return None;
        }
        let mut end = text.len().min(room);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        self.truncated |= end < text.len();
        target.push_str(&text[..end]);
        Some(text[..end].to_owned())
    }
}

/// Most events of a kernel queued for its reader: past that (nobody reads between cells, or a flood outruns the
/// cell), output is dropped as it arrives, so what a kernel prints costs the host at most this many chunks.
const QUEUED_EVENTS: usize = 256;

/// Drains a kernel's events as they come into a bounded queue: output that does not fit is dropped, the exit never.
fn bounded(mut events: mpsc::UnboundedReceiver<BackgroundEvent>) -> mpsc::Receiver<BackgroundEvent> {
    let (queue, queued) = mpsc::channel(QUEUED_EVENTS);
    tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            match event {
                BackgroundEvent::Output(..) => {
                    if let Err(mpsc::error::TrySendError::Closed(_)) = queue.try_send(event) {
                        return;
                    }
                }
                BackgroundEvent::Exited(_) => {
                    let _ = queue.send(event).await;
                    return;
                }
            }
        }
    });
    queued
}

/// A started kernel.
pub struct Kernel {
    command: Arc<BackgroundCommand>,
    events: mpsc::Receiver<BackgroundEvent>,
    lines: LineSplitter,
    next_request: u64,
    exited: Option<CommandExit>,
}

fn describe_exit(exit: &CommandExit) -> String {
    match (exit.exit_code, exit.signal) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("signal {signal}"),
        (None, None) => "an unknown status".to_owned(),
    }
}

impl Kernel {
    /// Starts a kernel in `host`'s sandbox, in `cwd`, with the `preload` modules loaded, and waits until it is ready.
    pub async fn start(
        host: &KernelHost,
        language: CodeLanguage,
        preload: &[String],
        cwd: Option<&str>,
    ) -> Result<Kernel, Failure> {
        let spec = kernel_command(language, preload, cwd, host.memory_bytes);
        let (command, events) = host.agent.spawn_background(spec, None).await?;
        let mut kernel = Kernel {
            command: Arc::new(command),
            events: bounded(events),
            lines: LineSplitter::default(),
            next_request: 1,
            exited: None,
        };
        let timeout = start_timeout(host);
        let deadline = Instant::now() + timeout;
        let mut stderr = Vec::new();
        let program = match language {
            CodeLanguage::Python => "python3",
            CodeLanguage::Javascript | CodeLanguage::Typescript => "node",
            CodeLanguage::Bash => "bash",
            CodeLanguage::Java => "java",
            CodeLanguage::R => "R",
        };
        loop {
            let event = tokio::time::timeout_at(deadline, kernel.events.recv()).await;
            match event {
                Ok(Some(BackgroundEvent::Output(StreamKind::Stdout, bytes))) => {
                    let ready = kernel
                        .lines
                        .push(&bytes)
                        .into_iter()
                        .any(|line| matches!(line, Line::Message(KernelMessage::Ready {})));
                    if ready {
                        return Ok(kernel);
                    }
                }
                Ok(Some(BackgroundEvent::Output(StreamKind::Stderr, bytes))) => {
                    let room = START_STDERR_BYTES.saturating_sub(stderr.len());
                    stderr.extend_from_slice(&bytes[..bytes.len().min(room)]);
                }
                Ok(Some(BackgroundEvent::Exited(exit))) => {
                    return Err(error::start_failed(format!(
                        "the {program} kernel ended with {} before it was ready: {}",
                        describe_exit(&exit),
                        String::from_utf8_lossy(&stderr).trim()
                    )));
                }
                Ok(None) => return Err(sandbox_gone()),
                Err(_) => {
                    let _ = kernel.command.kill().await;
                    return Err(error::start_failed(format!(
                        "the {program} kernel was not ready after {} s",
                        timeout.as_secs()
                    )));
                }
            }
        }
    }

    /// Whether the kernel still runs, as far as its events tell; what it wrote while no cell ran is dropped (a
    /// spare kernel's output before it is adopted belongs to nobody).
    pub fn is_running(&mut self) -> bool {
        loop {
            match self.events.try_recv() {
                Ok(BackgroundEvent::Exited(exit)) => self.exited = Some(exit),
                Ok(BackgroundEvent::Output(..)) => {}
                Err(mpsc::error::TryRecvError::Empty) => return self.exited.is_none(),
                Err(mpsc::error::TryRecvError::Disconnected) => return false,
            }
        }
    }

    /// A handle that can kill the kernel while a cell runs.
    pub fn command(&self) -> Arc<BackgroundCommand> {
        Arc::clone(&self.command)
    }

    /// Kills the kernel and waits (briefly) until it has exited.
    pub async fn shutdown(mut self) {
        if self.exited.is_some() {
            return;
        }
        let _ = self.command.kill().await;
        let deadline = Instant::now() + Duration::from_secs(2);
        while let Ok(Some(event)) = tokio::time::timeout_at(deadline, self.events.recv()).await {
            if matches!(event, BackgroundEvent::Exited(_)) {
                return;
            }
        }
    }

    /// Runs one cell with its own `env`: at most `timeout` before it is interrupted (or sooner, when `interrupt`
    /// fires), output kept up to `limit` bytes per stream.
    pub async fn run(&mut self, cell: Cell<'_>, output: &CellOutput, mut interrupt: Option<CellInterrupt>) -> CellRun {
        let Cell { code, env, timeout, limit } = cell;
        let mut run = CellRun::default();
        // Whatever arrived between cells (output of threads or timers of earlier cells) is not this cell's.
        while let Ok(event) = self.events.try_recv() {
            if let BackgroundEvent::Exited(exit) = event {
                self.exited = Some(exit);
            }
        }
        if let Some(exit) = self.exited {
            return self.lost(run, &format!("the interpreter had ended ({})", describe_exit(&exit)));
        }
        let id = self.next_request;
        self.next_request += 1;
        let request = serde_json::json!({"id": id, "code": code, "env": env, "timeout_ms": timeout.as_millis() as u64});
        let mut line = request.to_string();
        line.push('\n');
        if let Err(failure) = self.command.send_stdin(line.as_bytes()).await {
            return self.lost(run, &format!("the interpreter cannot take input: {}", failure.message));
        }
        let mut deadline = Instant::now() + timeout;
        let mut interrupted = false;
        loop {
            let waited = tokio::select! {
                waited = tokio::time::timeout_at(deadline, self.events.recv()) => waited,
                fired = interrupted_by(&mut interrupt) => {
                    // Interrupted from outside (its client left): as at the timeout, from now on.
                    interrupt = None;
                    if fired && !interrupted {
                        deadline = Instant::now();
                    }
                    continue;
                }
            };
            let event = match waited {
                Ok(event) => event,
                Err(_) if !interrupted => {
                    interrupted = true;
                    deadline = Instant::now() + INTERRUPT_GRACE;
                    let _ = self.command.signal(libc::SIGINT).await;
                    continue;
                }
                Err(_) => {
                    let _ = self.command.kill().await;
                    let message = format!(
                        "the cell ran past its timeout of {} ms and did not stop when interrupted",
                        timeout.as_millis()
                    );
                    let mut run = self.lost(run, &message);
                    if let Some(error) = &mut run.host_error {
                        error.name = "TimeoutError".to_owned();
                    }
                    return run;
                }
            };
            match event {
                Some(BackgroundEvent::Output(StreamKind::Stdout, bytes)) => {
                    for line in self.lines.push(&bytes) {
                        match line {
                            Line::Message(KernelMessage::Reply(reply)) if reply.id == Some(id) => {
                                run.reply = Some(reply);
                                return run;
                            }
                            Line::Message(KernelMessage::Stream { name, text }) => {
                                let stream = if name == "stderr" { StreamKind::Stderr } else { StreamKind::Stdout };
                                forward(&mut run, output, stream, &text, limit).await;
                            }
                            Line::Message(_) => {}
                            Line::Raw(text) => forward(&mut run, output, StreamKind::Stdout, &text, limit).await,
                            Line::Oversized => {
                                run.host_error = Some(CellError {
                                    name: "ResultTooLarge".to_owned(),
                                    value: format!(
                                        "the cell's result is larger than {} MiB and was dropped",
                                        super::wire::MAX_LINE_BYTES >> 20
                                    ),
                                    traceback: Vec::new(),
                                });
                                return run;
                            }
                        }
                    }
                }
                Some(BackgroundEvent::Output(StreamKind::Stderr, bytes)) => {
                    let text = String::from_utf8_lossy(&bytes).into_owned();
                    forward(&mut run, output, StreamKind::Stderr, &text, limit).await;
                }
                Some(BackgroundEvent::Exited(exit)) => {
                    self.exited = Some(exit);
                    return self.lost(run, &format!("the interpreter ended ({})", describe_exit(&exit)));
                }
                None => {
                    self.exited = Some(CommandExit::default());
                    return self.lost(run, "the sandbox is gone");
                }
            }
        }
    }

    fn lost(&mut self, mut run: CellRun, why: &str) -> CellRun {
        run.kernel_lost = true;
        run.host_error = Some(CellError {
            name: "KernelRestarted".to_owned(),
            value: format!("{why}; the context was restarted and its state is lost"),
            traceback: Vec::new(),
        });
        run
    }
}

/// Fires when the caller interrupts the cell: true when it did, false when it dropped its sender (it never will);
/// never resolves without one.
async fn interrupted_by(interrupt: &mut Option<CellInterrupt>) -> bool {
    match interrupt {
        Some(receiver) => receiver.await.is_ok(),
        None => std::future::pending().await,
    }
}

async fn forward(run: &mut CellRun, output: &CellOutput, stream: StreamKind, text: &str, limit: usize) {
    if let Some(kept) = run.keep(stream, text, limit) {
        // The caller may have stopped listening (a client hung up): the cell goes on.
        let _ = output.send(OutputChunk { stream, data: kept.into_bytes() }).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preload_modules_follow_the_kernel_program() {
        let preload = ["fractions".to_owned(), "json".to_owned()];
        let python = kernel_command(CodeLanguage::Python, &preload, None, 1 << 30);
        assert_eq!(python.argv.unwrap_or_default(), ["python3", "-c", PYTHON_KERNEL, "fractions", "json"]);
        assert_eq!(python.cwd, None, "the sandbox's default working directory");
        let node = kernel_command(CodeLanguage::Javascript, &[], Some("/home/user/work"), 1 << 30);
        assert_eq!(node.argv.unwrap_or_default(), ["node", "-e", NODE_KERNEL], "a cold kernel has no arguments");
        assert_eq!(node.cwd.as_deref(), Some("/home/user/work"));
    }

    /// The launcher and the kernel on the host (no sandbox): the kernel compiles, answers, leaves no source file, and
    /// recovers from a snippet that leaves jshell unable to compile.
    #[test]
    fn java_kernel_starts_from_its_launcher_and_leaves_no_source_file() -> Result<(), Box<dyn std::error::Error>> {
        use std::io::{BufRead, BufReader, Write};
        if !std::path::Path::new("/usr/bin/jshell").exists() {
            eprintln!("skipped: no JDK on this host (/usr/bin/jshell)");
            return Ok(());
        }
        let tmp = tempfile::tempdir()?;
        let spec = kernel_command(CodeLanguage::Java, &["ignored".to_owned()], None, 256 << 20);
        let argv = spec.argv.unwrap_or_default();
        assert_eq!(argv[argv.len() - 2..], [JAVA_KERNEL.to_owned(), (256u64 << 20).to_string()], "no preload names");
        let mut child = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .env("TMPDIR", tmp.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
        let mut next = || -> Result<serde_json::Value, Box<dyn std::error::Error>> {
            Ok(serde_json::from_str(&lines.next().ok_or("the kernel ended")??)?)
        };
        let ready = next()?;
        assert_eq!(ready["type"], "ready", "{ready}");
        assert_eq!(std::fs::read_dir(tmp.path())?.count(), 0, "the kernel's source file was left behind");
        let mut stdin = child.stdin.take().ok_or("no stdin")?;
        stdin.write_all(b"{\"id\":1,\"code\":\"int x = 41;\\nx + 1\",\"env\":{}}\n")?;
        // A constant javac cannot generate leaves jshell unable to compile anything: the kernel starts a new one.
        let too_long = serde_json::json!({"id": 2, "code": format!("String s = \"{}\";", "x".repeat(70_000))});
        stdin.write_all(format!("{too_long}\n{}\n", serde_json::json!({"id": 3, "code": "1 + 1"})).as_bytes())?;
        drop(stdin);
        let reply = next()?;
        assert_eq!(reply["results"][0]["text/plain"], "42", "{reply}");
        let refused = next()?;
        assert_eq!(refused["error"]["name"], "CompilationException", "{refused}");
        assert!(refused["error"]["value"].as_str().unwrap_or_default().contains("state was reset"), "{refused}");
        let after = next()?;
        assert_eq!(after["results"][0]["text/plain"], "2", "the kernel compiles again: {after}");
        assert!(child.wait()?.success(), "the kernel ends when its input does");
        Ok(())
    }

    /// The R kernel on the host (no sandbox): a value printed as R prints it, an interrupt sent to the kernel's
    /// process group (as the host sends it) stops the running cell and not the session, and one that lands between
    /// cells does not stop the next cell.
    #[test]
    fn r_kernel_answers_values_and_survives_interrupts_in_and_between_cells() -> Result<(), Box<dyn std::error::Error>>
    {
        use std::io::{BufRead, BufReader, Write};
        use std::os::unix::process::CommandExt;
        if !std::path::Path::new("/usr/bin/R").exists() {
            eprintln!("skipped: no R on this host (/usr/bin/R)");
            return Ok(());
        }
        let spec = kernel_command(CodeLanguage::R, &["ignored".to_owned()], None, 256 << 20);
        let argv = spec.argv.unwrap_or_default();
        assert_eq!(argv, ["python3", "-c", R_KERNEL], "no preload names");
        let mut child = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .process_group(0)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let group = format!("-{}", child.id());
        let interrupt = || std::process::Command::new("kill").args(["-INT", "--", &group]).status();
        let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
        let mut reply = || -> Result<serde_json::Value, Box<dyn std::error::Error>> {
            loop {
                let message: serde_json::Value = serde_json::from_str(&lines.next().ok_or("the kernel ended")??)?;
                if message["type"] != "stream" {
                    return Ok(message);
                }
            }
        };
        assert_eq!(reply()?["type"], "ready");
        let mut stdin = child.stdin.take().ok_or("no stdin")?;
        let mut send = |id: u32, code: &str| {
            stdin.write_all(format!("{}\n", serde_json::json!({"id": id, "code": code, "env": {}})).as_bytes())
        };
        send(1, "x <- 41\nx + 1")?;
        assert_eq!(reply()?["results"][0]["text/plain"], "[1] 42");
        send(2, "repeat {}")?;
        std::thread::sleep(Duration::from_millis(1500));
        interrupt()?;
        let stopped = reply()?;
        assert_eq!(stopped["error"]["name"], "KeyboardInterrupt", "{stopped}");
        interrupt()?;
        std::thread::sleep(Duration::from_millis(300));
        send(3, "for (i in 1:3e6) NULL\nx")?;
        let after = reply()?;
        assert_eq!(after["error"], serde_json::Value::Null, "an interrupt between cells stopped the next: {after}");
        assert_eq!(after["results"][0]["text/plain"], "[1] 41", "{after}");
        drop(stdin);
        assert!(child.wait()?.success(), "the kernel ends when its input does");
        Ok(())
    }

    #[tokio::test]
    async fn output_nobody_reads_is_dropped_but_the_exit_always_arrives() {
        let (events, raw) = mpsc::unbounded_channel();
        let mut queued = bounded(raw);
        for _ in 0..10 * QUEUED_EVENTS {
            let _ = events.send(BackgroundEvent::Output(StreamKind::Stdout, vec![b'x'; 1024]));
        }
        let _ = events.send(BackgroundEvent::Exited(CommandExit::default()));
        // Nobody reads for a while (between cells): the drain runs meanwhile.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut outputs = 0;
        while let Some(event) = queued.recv().await {
            match event {
                BackgroundEvent::Output(..) => outputs += 1,
                BackgroundEvent::Exited(_) => break,
            }
        }
        assert!(outputs <= QUEUED_EVENTS, "{outputs} chunks were held for a queue of {QUEUED_EVENTS}");
        assert!(events.is_closed(), "the drain ended with the exit");
    }
}
