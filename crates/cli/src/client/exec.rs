//! `sandbox exec ID -- CMD ARGS…`: plain mode streams the command's output as server-sent events to this process's
//! stdout and stderr as it arrives and exits with the command's code; `--json` prints the result object;
//! `--background` starts it and prints its command id (`--json`: the whole answer) without waiting.

use std::io::{BufRead, IsTerminal, Read, Write};

use base64::Engine as _;
use clap::Args;
use serde_json::{Map, Value};

use sandkasten_types::units::parse_duration_ms;

use crate::client::commands::{environment, sandbox_path};
use crate::client::http::{Client, ClientError};
use crate::client::output;
use crate::exit_codes;

/// Arguments of `sandbox exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Sandbox id.
    pub id: String,
    /// Print the result (output, exit code, timings) as one JSON object instead of streaming the output.
    #[arg(long)]
    pub json: bool,
    /// Time limit of the command, e.g. 10s (default and maximum: the sandbox's command timeout).
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
    /// Environment variable for the command (KEY=VALUE, or KEY to pass this shell's value). Repeatable.
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Working directory inside the sandbox (absolute; default /workspace).
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// Start the command in the background and print its id at once (it keeps running; its output, stdin and
    /// signals are under the API's `/v1/sandboxes/ID/commands/COMMAND_ID`).
    #[arg(long)]
    pub background: bool,
    /// Do not forward standard input (otherwise, when it is not a terminal, it is read to its end and given to the
    /// command).
    #[arg(short = 'n', long = "no-stdin")]
    pub no_stdin: bool,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// This process's standard input as text to send to the server, unless `skip` is set or it is a terminal; `advice`
/// finishes the error for bytes that are not UTF-8 (what to do instead).
pub(crate) fn stdin_text(skip: bool, advice: &str) -> Result<Option<String>, ClientError> {
    let mut stdin = std::io::stdin();
    if skip || stdin.is_terminal() {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    stdin.read_to_end(&mut bytes).map_err(|e| ClientError::input(format!("reading standard input failed: {e}")))?;
    if bytes.is_empty() {
        return Ok(None);
    }
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| ClientError::input(format!("standard input is not UTF-8 text, {advice}")))
}

fn request(args: &ExecArgs) -> Result<Value, ClientError> {
    let mut body = Map::new();
    body.insert("argv".into(), args.command.clone().into());
    body.insert("env".into(), Value::Object(environment(&args.env)?));
    if let Some(cwd) = &args.cwd {
        body.insert("cwd".into(), cwd.clone().into());
    }
    if let Some(timeout) = &args.timeout {
        let ms = parse_duration_ms(timeout).map_err(|e| ClientError::input(format!("--timeout: {e}")))?;
        body.insert("timeout_ms".into(), ms.into());
    }
    if args.background {
        body.insert("background".into(), true.into());
    }
    if let Some(stdin) = stdin_text(args.no_stdin, "which exec cannot forward: copy it in with `cp` instead")? {
        body.insert("stdin".into(), stdin.into());
    }
    Ok(Value::Object(body))
}

/// Runs `sandbox exec` and returns the command's exit code.
pub fn exec(client: &Client, args: ExecArgs) -> Result<i32, ClientError> {
    let path = format!("{}/exec", sandbox_path(&args.id)?);
    let body = request(&args)?;
    if args.background {
        let started = client.post_json(&path, &body)?;
        match started["command_id"].as_str() {
            Some(command_id) if !args.json => println!("{command_id}"),
            _ => output::print_json(&started),
        }
        return Ok(0);
    }
    if args.json {
        let result = client.post_json(&path, &body)?;
        output::print_json(&result);
        return Ok(exit_code(&result, false));
    }
    stream(client.post_stream(&path, &body)?)
}

/// The exit code for a result or `exit` event; `explain` prints a note when sandkasten (not the command) decided.
pub fn exit_code(result: &Value, explain: bool) -> i32 {
    let note = |text: &str| {
        if explain {
            eprintln!("sandkasten: {text}");
        }
    };
    if result["stdout_truncated"] == true || result["stderr_truncated"] == true {
        note("output passed the sandbox's output limit and was cut");
    }
    if result["timed_out"] == true {
        note("the command timed out and was killed");
        return exit_codes::TIMEOUT;
    }
    let code = |key: &str| result[key].as_i64().and_then(|n| i32::try_from(n).ok());
    match (code("exit_code"), code("signal")) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => exit_codes::SANDBOX_ERROR,
    }
}

/// The exit code for an `error` event's code.
fn error_exit(code: &str) -> i32 {
    match code {
        "internal" => exit_codes::SANDBOX_ERROR,
        _ => exit_codes::BAD_INPUT,
    }
}

/// Writes the chunk of a `stdout` or `stderr` event to this process's stdout or stderr.
pub(crate) fn write_chunk(event: &str, data: &str) -> Result<(), ClientError> {
    let chunk: Value = serde_json::from_str(data)
        .map_err(|e| ClientError::server(format!("the server sent a malformed {event} event: {e}")))?;
    let bytes = match chunk["base64"].as_str() {
        Some(encoded) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| ClientError::server(format!("the server sent bad base64: {e}")))?,
        None => chunk["data"].as_str().unwrap_or_default().as_bytes().to_vec(),
    };
    // A closed terminal or pipe must not stop the stream: the exit code still reports the end.
    let _ = if event == "stdout" {
        let mut out = std::io::stdout().lock();
        out.write_all(&bytes).and_then(|()| out.flush())
    } else {
        std::io::stderr().lock().write_all(&bytes)
    };
    Ok(())
}

/// The error an `error` event reports.
pub(crate) fn event_error(data: &str) -> ClientError {
    let error: Value = serde_json::from_str(data).unwrap_or(Value::Null);
    let message = error["message"].as_str().unwrap_or("the server reported an error").to_owned();
    ClientError { exit_code: error_exit(error["code"].as_str().unwrap_or("internal")), message }
}

/// Handles one event; `Some(code)` at the end of the stream.
fn handle(event: &str, data: &str) -> Result<Option<i32>, ClientError> {
    match event {
        "stdout" | "stderr" => write_chunk(event, data).map(|()| None),
        "exit" => {
            let exit: Value = serde_json::from_str(data)
                .map_err(|e| ClientError::server(format!("the server sent a malformed exit event: {e}")))?;
            Ok(Some(exit_code(&exit, true)))
        }
        "error" => Err(event_error(data)),
        _ => Ok(None),
    }
}

/// Reads server-sent events to the `exit` (or `error`) event.
fn stream(reader: impl BufRead) -> Result<i32, ClientError> {
    read_events(reader, handle)
}

/// Reads server-sent events, giving each (name, data) to `handle`, until it returns an exit code.
pub(crate) fn read_events(
    reader: impl BufRead,
    mut handle: impl FnMut(&str, &str) -> Result<Option<i32>, ClientError>,
) -> Result<i32, ClientError> {
    let (mut event, mut data) = (String::new(), String::new());
    for line in reader.lines() {
        let line = line.map_err(|e| ClientError::server(format!("the server's event stream broke: {e}")))?;
        if line.is_empty() {
            if let Some(code) = handle(&event, &data)? {
                return Ok(code);
            }
            event.clear();
            data.clear();
        } else if let Some(value) = line.strip_prefix("event:") {
            value.trim_start().clone_into(&mut event);
        } else if let Some(value) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(value.strip_prefix(' ').unwrap_or(value));
        }
    }
    Err(ClientError::server("the server ended the stream before the command ended"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_stream_ends_with_the_commands_exit_code() {
        let text = ": keep-alive\n\nevent: stdout\ndata: {\"data\":\"\"}\n\nevent: exit\ndata: {\"exit_code\":3,\
            \"signal\":null,\"timed_out\":false}\n\n";
        assert_eq!(stream(text.as_bytes()), Ok(3));
        let error = "event: error\ndata: {\"code\":\"conflict\",\"message\":\"sandbox gone\"}\n\n";
        assert_eq!(stream(error.as_bytes()), Err(ClientError::input("sandbox gone")));
        assert!(stream("event: stdout\ndata: {}\n\n".as_bytes()).is_err(), "no exit event");
    }

    #[test]
    fn exit_codes_follow_the_result() {
        assert_eq!(exit_code(&json!({"exit_code": 0, "signal": null}), false), 0);
        assert_eq!(exit_code(&json!({"exit_code": null, "signal": 9}), false), 137);
        assert_eq!(exit_code(&json!({"exit_code": null, "signal": 9, "timed_out": true}), false), exit_codes::TIMEOUT);
    }
}
