//! envd's process service (`/process.Process/*`) over the runtime's background commands: `Start` runs a command
//! and streams a start event (its pid), its output and an end event (exit code); `Connect` re-attaches to a running
//! one by pid or tag (replaying its retained output first); `List`, `SendInput`, `StreamInput`, `CloseStdin`,
//! `SendSignal` and `Update` (a PTY's size) act on running commands by pid.
//! Foreground and background are the same to the server: the SDK decides whether it waits. A stream the client
//! drops does not stop its command (E2B's `disconnect`). `user="root"` runs the command as the sandbox's root (uid 0
//! inside its user namespace, no capabilities). `pty` in `StartRequest` runs the command on a pseudo-terminal of the
//! sandbox (the runtime's `spec.pty`): its output arrives as `pty` data, input is `pty` bytes, `Update` resizes it. As
//! envd, a size of 0 is taken as it is (a terminal of unknown size); more than 1000 columns or rows is refused.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use sandkasten_types::{CommandEvent, CommandSpec, CommandStatus, PtySize};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::api::commands::start_background;
use crate::api::scan;
use crate::e2b::auth::{SandboxAccess, request_user, runtime_failure, sandbox_access, sandbox_user};
use crate::e2b::connect::{self, StreamWriter};
use crate::e2b::error::{Code, E2bError};
use crate::e2b::paths;
use crate::e2b::sessions::ProcessMeta;
use crate::state::AppState;
use sandkasten_scan::ScanLanguage;

/// How often an idle stream carries a keepalive event.
const KEEPALIVE: Duration = Duration::from_secs(30);

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ProcessConfig {
    cmd: String,
    args: Vec<String>,
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

/// envd's `PTY` message: `{"size": {"cols", "rows"}}`; proto3 JSON leaves out zeros.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Pty {
    size: PtySizeMessage,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PtySizeMessage {
    cols: u32,
    rows: u32,
}

impl Pty {
    /// The size asked for: each side up to `PtySize::MAX` (0 allowed, as envd allows it).
    fn size(&self) -> Result<PtySize, E2bError> {
        let side = |n: u32, what: &str| {
            u16::try_from(n)
                .ok()
                .filter(|n| *n <= PtySize::MAX)
                .ok_or_else(|| E2bError::invalid(format!("the pty's {what} must be at most {}, got {n}", PtySize::MAX)))
        };
        Ok(PtySize { cols: side(self.size.cols, "cols")?, rows: side(self.size.rows, "rows")? })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct UpdateRequest {
    process: Option<Selector>,
    pty: Option<Pty>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StartRequest {
    process: Option<ProcessConfig>,
    pty: Option<Pty>,
    tag: Option<String>,
    stdin: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Selector {
    pid: Option<u32>,
    tag: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SelectorRequest {
    process: Option<Selector>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Input {
    stdin: Option<String>,
    pty: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SendInputRequest {
    process: Option<Selector>,
    input: Option<Input>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SignalValue {
    Name(String),
    Number(i32),
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SendSignalRequest {
    process: Option<Selector>,
    signal: Option<SignalValue>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StreamInputStart {
    process: Option<Selector>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StreamInputData {
    input: Option<Input>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StreamInputRequest {
    start: Option<StreamInputStart>,
    data: Option<StreamInputData>,
}

#[derive(Debug, Serialize)]
struct ProcessInfo {
    config: ProcessConfigOut,
    pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    tag: Option<String>,
}

#[derive(Debug, Serialize)]
struct ProcessConfigOut {
    cmd: String,
    args: Vec<String>,
    envs: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cwd: Option<String>,
}

/// `POST /process.Process/{method}`.
pub(crate) async fn call(
    State(state): State<AppState>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let streaming = matches!(method.as_str(), "Start" | "Connect");
    let access = match sandbox_access(&state, &headers).await {
        Ok(access) => access,
        Err(error) if streaming => return connect::failed_stream(error),
        Err(error) => return error.into_connect(),
    };
    let result = match method.as_str() {
        "Start" => start(&state, &access, &headers, &body).await,
        "Connect" => attach(&state, &access, &body).await,
        "List" => list(&state, &access).await,
        "SendInput" => send_input(&state, &access, &body).await,
        "StreamInput" => stream_input(&state, &access, &body).await,
        "CloseStdin" => close_stdin(&state, &access, &body).await,
        "SendSignal" => send_signal(&state, &access, &body).await,
        "Update" => update(&state, &access, &body).await,
        other => Err(E2bError::new(Code::Unimplemented, format!("process.Process/{other} does not exist"))),
    };
    match result {
        Ok(response) => response,
        Err(error) if streaming => connect::failed_stream(error),
        Err(error) => error.into_connect(),
    }
}

fn command_spec(request: StartRequest, access: &SandboxAccess, headers: &HeaderMap) -> Result<CommandSpec, E2bError> {
    let user = sandbox_user(&request_user(headers)?)?;
    let pty = request.pty.as_ref().map(Pty::size).transpose()?;
    let process = request.process.ok_or_else(|| E2bError::invalid("give the process to start"))?;
    if process.cmd.is_empty() {
        return Err(E2bError::invalid("the process's cmd is empty"));
    }
    crate::validate::environment(&process.envs).map_err(E2bError::invalid)?;
    // Without a cwd the command starts in the sandbox user's home (`/home/user` in facade sandboxes).
    let cwd = process.cwd.as_deref().map(paths::to_sandbox).transpose()?;
    let limit = access.record.spec.limits.timeout_ms;
    let timeout_ms = connect::timeout_ms(headers).map_or(limit, |ms| ms.min(limit));
    let mut argv = vec![process.cmd];
    argv.extend(process.args);
    crate::validate::argv(&argv).map_err(E2bError::invalid)?;
    Ok(CommandSpec {
        argv: Some(argv),
        env: process.envs,
        cwd,
        // Without `stdin: true` the command's stdin is closed at once (E2B's default); a terminal's input stays open.
        stdin: if request.stdin == Some(true) || pty.is_some() { None } else { Some(String::new()) },
        timeout_ms: Some(timeout_ms),
        user,
        pty,
        ..CommandSpec::default()
    })
}

async fn start(
    state: &AppState,
    access: &SandboxAccess,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, E2bError> {
    let request: StartRequest = connect::decode_stream_request(body)?;
    let tag = request.tag.clone();
    let cwd = request.process.as_ref().and_then(|process| process.cwd.clone());
    let spec = command_spec(request, access, headers)?;
    // The tenant's scan policy refuses in enforce (the facade's answers have no place for warn findings).
    let line = spec.argv.as_deref().map(sandkasten_scan::argv_command_line).unwrap_or_default();
    scan::gate(&access.tenant, None, ScanLanguage::Bash, &line).await?;
    let envs = spec.env.clone();
    let pty = spec.pty.is_some();
    let limit = access.record.spec.limits.output_bytes;
    let (command_id, status) = start_background(state, &access.tenant, &access.id, spec, limit).await?;
    let meta = ProcessMeta { sandbox: access.id.clone(), envs, cwd, tag, pty, ..ProcessMeta::default() };
    state.e2b().started(&command_id, meta);
    let events = match state.runtime().stream_command(&access.id, &command_id, 0).await {
        Ok(events) => events,
        Err(failure) => return Err(runtime_failure(state, &access.id, failure).await),
    };
    let (writer, response) = connect::stream();
    tokio::spawn(forward(state.clone(), access.id.clone(), writer, status.pid, pty, events));
    Ok(response)
}

async fn find(state: &AppState, access: &SandboxAccess, selector: Option<Selector>) -> Result<CommandStatus, E2bError> {
    let selector = selector.unwrap_or_default();
    let commands = match state.runtime().list_commands(&access.id).await {
        Ok(commands) => commands,
        Err(failure) => return Err(runtime_failure(state, &access.id, failure).await),
    };
    let mut running = commands.into_iter().rev().filter(|command| command.ended_ms.is_none());
    match (selector.pid, selector.tag) {
        (Some(pid), _) => running
            .find(|command| command.pid == pid)
            .ok_or_else(|| E2bError::new(Code::NotFound, format!("process with pid {pid} not found"))),
        (None, Some(tag)) => running
            .find(|command| {
                state.e2b().process(&access.id, &command.id).is_some_and(|meta| meta.tag.as_ref() == Some(&tag))
            })
            .ok_or_else(|| E2bError::new(Code::NotFound, format!("process with tag {tag} not found"))),
        (None, None) => Err(E2bError::invalid("select the process by pid or tag")),
    }
}

async fn attach(state: &AppState, access: &SandboxAccess, body: &[u8]) -> Result<Response, E2bError> {
    let request: SelectorRequest = connect::decode_stream_request(body)?;
    let command = find(state, access, request.process).await?;
    // The retained output first (envd sends only what comes after the connect), then the live output.
    let events = match state.runtime().stream_command(&access.id, &command.id, 0).await {
        Ok(events) => events,
        Err(failure) => return Err(runtime_failure(state, &access.id, failure).await),
    };
    let pty = state.e2b().process(&access.id, &command.id).is_some_and(|meta| meta.pty);
    let (writer, response) = connect::stream();
    tokio::spawn(forward(state.clone(), access.id.clone(), writer, command.pid, pty, events));
    Ok(response)
}

fn event(inner: Value) -> Value {
    json!({ "event": inner })
}

/// The end event of a command that ended, or the stream's error when it did not end by itself.
fn end_event(status: &CommandStatus) -> Result<Value, E2bError> {
    let Some(exit) = status.exit else {
        return Err(E2bError::new(Code::Unavailable, "the sandbox ended before the command did"));
    };
    if exit.timed_out {
        return Err(E2bError::new(Code::DeadlineExceeded, "the command ran past its timeout and was killed"));
    }
    let end = match (exit.exit_code, exit.signal) {
        (Some(code), _) => json!({ "exitCode": code, "exited": true, "status": format!("exit status {code}") }),
        (None, Some(signal)) => json!({ "exitCode": -1, "exited": false, "status": format!("signal: {signal}") }),
        (None, None) => json!({ "exitCode": -1, "exited": false, "status": "unknown" }),
    };
    Ok(event(json!({ "end": end })))
}

/// Longest a stream cut off by its sandbox's end waits for the sandbox's session to close.
const SESSION_CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Waits (at most [`SESSION_CLOSE_WAIT`]) until the facade's session of sandbox `id` is closed, i.e. the sandbox's
/// end is recorded. A stream cut off by a kill ends only then: the SDK probes `/health` on such an error, and only a
/// "was not found" answer makes it raise "killed or reached its end of life" (a probe that still finds the sandbox
/// running makes it "unreachable, state unknown").
async fn session_closed(state: &AppState, id: &str) {
    let deadline = tokio::time::Instant::now() + SESSION_CLOSE_WAIT;
    while state.e2b().get(id).is_some() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Streams a command's events to the client: start, data (a terminal's as `pty`), end (or the error that ended it),
/// keepalives between.
async fn forward(
    state: AppState,
    id: String,
    writer: StreamWriter,
    pid: u32,
    pty: bool,
    mut events: mpsc::Receiver<CommandEvent>,
) {
    if !writer.send(&event(json!({ "start": { "pid": pid } }))).await {
        return;
    }
    let mut keepalive = tokio::time::interval_at(tokio::time::Instant::now() + KEEPALIVE, KEEPALIVE);
    loop {
        tokio::select! {
            received = events.recv() => match received {
                Some(CommandEvent::Output { chunk, .. }) => {
                    let stream = if pty { "pty" } else { chunk.stream.as_str() };
                    let data = event(json!({ "data": { stream: STANDARD.encode(&chunk.data) } }));
                    if !writer.send(&data).await {
                        return;
                    }
                }
                Some(CommandEvent::Ended(status)) => {
                    match end_event(&status) {
                        Ok(end) => {
                            writer.send(&end).await;
                            writer.finish(None).await;
                        }
                        Err(error) => {
                            if error.code == Code::Unavailable {
                                session_closed(&state, &id).await;
                            }
                            writer.finish(Some(error)).await;
                        }
                    }
                    return;
                }
                None => {
                    let error = E2bError::new(Code::Unavailable, "the command's stream ended: the sandbox is gone");
                    session_closed(&state, &id).await;
                    writer.finish(Some(error)).await;
                    return;
                }
            },
            _ = keepalive.tick() => {
                if !writer.send(&event(json!({ "keepalive": {} }))).await {
                    return;
                }
            }
        }
    }
}

async fn list(state: &AppState, access: &SandboxAccess) -> Result<Response, E2bError> {
    let commands = match state.runtime().list_commands(&access.id).await {
        Ok(commands) => commands,
        Err(failure) => return Err(runtime_failure(state, &access.id, failure).await),
    };
    let known: Vec<&str> = commands.iter().map(|command| command.id.as_str()).collect();
    state.e2b().retain_processes(&access.id, &known);
    let processes: Vec<ProcessInfo> = commands
        .iter()
        .filter(|command| command.ended_ms.is_none())
        .map(|command| {
            let meta = state.e2b().process(&access.id, &command.id).unwrap_or_default();
            let mut argv = command.argv.iter().cloned();
            let cmd = argv.next().unwrap_or_default();
            let config = ProcessConfigOut { cmd, args: argv.collect(), envs: meta.envs, cwd: meta.cwd };
            ProcessInfo { config, pid: command.pid, tag: meta.tag }
        })
        .collect();
    Ok(connect::unary(&json!({ "processes": processes })))
}

/// The bytes of an input message: `stdin` for a process on pipes, `pty` for one on a terminal (both go to the
/// command's input; the terminal is its stdin).
fn stdin_bytes(input: Option<Input>) -> Result<Vec<u8>, E2bError> {
    let input = input.unwrap_or_default();
    let (data, what) = match (input.pty, input.stdin) {
        (Some(pty), _) => (pty, "pty input"),
        (None, stdin) => (stdin.unwrap_or_default(), "stdin"),
    };
    STANDARD.decode(data.as_bytes()).map_err(|_| E2bError::invalid(format!("{what} is not base64")))
}

async fn write_stdin(
    state: &AppState,
    access: &SandboxAccess,
    command: &CommandStatus,
    data: Vec<u8>,
    eof: bool,
) -> Result<(), E2bError> {
    match state.runtime().command_stdin(&access.id, &command.id, data, eof).await {
        Ok(()) => Ok(()),
        Err(failure) => Err(runtime_failure(state, &access.id, failure).await),
    }
}

async fn send_input(state: &AppState, access: &SandboxAccess, body: &[u8]) -> Result<Response, E2bError> {
    let request: SendInputRequest = connect::decode(body)?;
    let command = find(state, access, request.process).await?;
    write_stdin(state, access, &command, stdin_bytes(request.input)?, false).await?;
    Ok(connect::unary(&json!({})))
}

async fn close_stdin(state: &AppState, access: &SandboxAccess, body: &[u8]) -> Result<Response, E2bError> {
    let request: SelectorRequest = connect::decode(body)?;
    let command = find(state, access, request.process).await?;
    write_stdin(state, access, &command, Vec::new(), true).await?;
    Ok(connect::unary(&json!({})))
}

/// Client streaming: a start message naming the process, then data messages, each written as it comes. The
/// answer is one (empty) message and the end of the stream.
async fn stream_input(state: &AppState, access: &SandboxAccess, body: &[u8]) -> Result<Response, E2bError> {
    let mut command = None;
    for (flags, payload) in connect::envelopes(body)? {
        if flags & connect::END_STREAM != 0 {
            break;
        }
        let message: StreamInputRequest = connect::decode(payload)?;
        if let Some(start) = message.start {
            command = Some(find(state, access, start.process).await?);
        } else if let Some(data) = message.data {
            let command = command.as_ref().ok_or_else(|| E2bError::invalid("the first message must be start"))?;
            write_stdin(state, access, command, stdin_bytes(data.input)?, false).await?;
        }
    }
    let (writer, response) = connect::stream();
    writer.send(&json!({})).await;
    writer.finish(None).await;
    Ok(response)
}

/// `Update`: a new size for a process's terminal (a request without `pty` changes nothing, as in envd).
async fn update(state: &AppState, access: &SandboxAccess, body: &[u8]) -> Result<Response, E2bError> {
    let request: UpdateRequest = connect::decode(body)?;
    let command = find(state, access, request.process).await?;
    if let Some(pty) = request.pty {
        let size = pty.size()?;
        if let Err(failure) = state.runtime().resize_command(&access.id, &command.id, size).await {
            return Err(runtime_failure(state, &access.id, failure).await);
        }
    }
    Ok(connect::unary(&json!({})))
}

fn signal_number(signal: Option<SignalValue>) -> Result<i32, E2bError> {
    match signal {
        Some(SignalValue::Name(name)) if name == "SIGNAL_SIGKILL" => Ok(9),
        Some(SignalValue::Name(name)) if name == "SIGNAL_SIGTERM" => Ok(15),
        Some(SignalValue::Number(number @ (9 | 15))) => Ok(number),
        _ => Err(E2bError::invalid("signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM")),
    }
}

async fn send_signal(state: &AppState, access: &SandboxAccess, body: &[u8]) -> Result<Response, E2bError> {
    let request: SendSignalRequest = connect::decode(body)?;
    let signal = signal_number(request.signal)?;
    let command = find(state, access, request.process).await?;
    match state.runtime().signal_command(&access.id, &command.id, signal).await {
        Ok(()) => Ok(connect::unary(&json!({}))),
        Err(failure) => Err(runtime_failure(state, &access.id, failure).await),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandkasten_types::CommandExit;

    fn ended(exit: Option<CommandExit>) -> CommandStatus {
        CommandStatus {
            id: "cmd-0".into(),
            argv: vec!["true".into()],
            pid: 7,
            started_ms: 0,
            ended_ms: Some(1),
            exit,
            stdout_truncated: false,
            stderr_truncated: false,
        }
    }

    #[test]
    fn end_events_carry_the_exit_code() {
        let exit = CommandExit { exit_code: Some(3), signal: None, timed_out: false, ..CommandExit::default() };
        let end = end_event(&ended(Some(exit))).ok();
        assert_eq!(end, Some(json!({"event": {"end": {"exitCode": 3, "exited": true, "status": "exit status 3"}}})));
        let timed_out = CommandExit { exit_code: None, signal: Some(9), timed_out: true, ..CommandExit::default() };
        assert_eq!(end_event(&ended(Some(timed_out))).err().map(|e| e.code), Some(Code::DeadlineExceeded));
        assert_eq!(end_event(&ended(None)).err().map(|e| e.code), Some(Code::Unavailable));
    }

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(signal_number(Some(SignalValue::Name("SIGNAL_SIGKILL".into()))).ok(), Some(9));
        assert_eq!(signal_number(Some(SignalValue::Number(15))).ok(), Some(15));
        assert!(signal_number(Some(SignalValue::Number(1))).is_err());
        assert!(signal_number(None).is_err());
    }

    #[test]
    fn start_request_parses_the_sdk_json() -> Result<(), serde_json::Error> {
        let json = r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"},"cwd":"/tmp"},
            "stdin":false}"#;
        let request: StartRequest = serde_json::from_str(json)?;
        let process = request.process.unwrap_or_default();
        assert_eq!(process.args, vec!["-l", "-c", "echo hi"]);
        assert_eq!(process.cwd.as_deref(), Some("/tmp"));
        assert_eq!(request.stdin, Some(false));
        Ok(())
    }
}
