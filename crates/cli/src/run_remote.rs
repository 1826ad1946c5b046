//! `sandkasten run --server URL` (or `SANDKASTEN_SERVER`): the same run sent to a running `sandkasten serve` as one
//! `POST /v1/run`, so that it takes a warm pool's sandbox (and its zygote) when the server has one for its limits.
//! The output and exit codes are the local path's: plain mode streams the output (server-sent events) and exits with
//! the program's code or the reserved code of the limit that fired; `--json` prints the local path's result object.
//!
//! The result's exit fields (`oom_killed`, `limit`, `usage`, `phases`) are the server's as they are (its `phases`
//! count from its request). Uploads keep their bytes, not their modes. Standard input, when it is not a terminal, is
//! read to its end first and must be UTF-8 text.

use base64::Engine as _;
use sandkasten_types::{Command, CommandExit, ErrorCode, ErrorInfo, ExecResult, LimitKind};
use serde::Deserialize as _;
use serde_json::{Map, Value, json};

use crate::client::exec::{event_error, read_events, stdin_text, write_chunk};
use crate::client::http::{Client, ClientError};
use crate::exit_codes;
use crate::run_input::{ProgramStdin, RunInput};

/// Runs `input` on the server at `url` and returns the exit code; `explain` prints the local path's notes.
pub fn run(url: &str, input: &RunInput, json: bool, explain: impl Fn(&ExecResult)) -> i32 {
    let key = std::env::var("SANDKASTEN_API_KEY").ok();
    let outcome = Client::new(url, key).and_then(|client| {
        let body = request(input)?;
        if json {
            let answer = client.post_json("/v1/run", &body)?;
            let result = to_result(&answer);
            match serde_json::to_string(&result) {
                Ok(text) => println!("{text}"),
                Err(error) => eprintln!("sandkasten: serialising the result failed: {error}"),
            }
            return Ok(exit_codes::for_result(&result));
        }
        let events = client.post_stream("/v1/run", &body)?;
        read_events(events, |event, data| match event {
            "stdout" | "stderr" => write_chunk(event, data).map(|()| None),
            "exit" => {
                let exit: Value = serde_json::from_str(data)
                    .map_err(|e| ClientError::server(format!("the server sent a malformed exit event: {e}")))?;
                let result = to_result(&exit);
                explain(&result);
                Ok(Some(exit_codes::for_result(&result)))
            }
            "error" => Err(event_error(data)),
            _ => Ok(None),
        })
    });
    outcome.unwrap_or_else(|error| {
        eprintln!("sandkasten: {}", error.message);
        error.exit_code
    })
}

/// The `POST /v1/run` body of a run.
fn request(input: &RunInput) -> Result<Value, ClientError> {
    let mut body = Map::new();
    if let Some(tier) = input.spec.isolation {
        body.insert("isolation".into(), tier.name().into());
    }
    if let Some(template) = &input.server_template {
        body.insert("template".into(), template.clone().into());
    }
    if !input.spec.workload.is_unset() {
        body.insert("workload".into(), serde_json::to_value(input.spec.workload).unwrap_or_default());
    }
    match &input.request.command {
        Command::Code { language, code } => {
            body.insert("language".into(), language.name().into());
            body.insert("code".into(), code.clone().into());
        }
        Command::Argv(argv) => {
            body.insert("argv".into(), argv.clone().into());
        }
    }
    body.insert("env".into(), serde_json::to_value(&input.request.env).unwrap_or_default());
    // All of them, as the local path has them: a pool serves only a request whose limits equal its own.
    body.insert("limits".into(), serde_json::to_value(&input.spec.limits).unwrap_or_default());
    let files: Vec<Value> = input
        .request
        .uploads
        .iter()
        .map(|upload| {
            let encoded = base64::engine::general_purpose::STANDARD.encode(&upload.contents);
            json!({"path": upload.path, "content_base64": encoded})
        })
        .collect();
    body.insert("files".into(), files.into());
    if input.spec.network.reaches_out() {
        body.insert("network".into(), serde_json::to_value(&input.spec.network).unwrap_or_default());
    }
    if let Some(stdin) =
        stdin_text(input.stdin == ProgramStdin::Empty, "which --server cannot forward: upload it with --upload")?
    {
        body.insert("stdin".into(), stdin.into());
    }
    Ok(Value::Object(body))
}

/// The local path's result object from the server's result (or `exit` event), whose exit fields (exit code or
/// signal, `timed_out`, `oom_killed`, `limit`, `usage`, `phases`) are a `CommandExit` as they are.
fn to_result(answer: &Value) -> ExecResult {
    let text = |key: &str| answer[key].as_str().unwrap_or_default().to_owned();
    let flag = |key: &str| answer[key].as_bool().unwrap_or(false);
    let exit = CommandExit::deserialize(answer).unwrap_or_default();
    let error = match answer["error"]["code"].as_str() {
        Some("compile_error") => Some(ErrorInfo::new(ErrorCode::CompileError, text_of(&answer["error"]["message"]))),
        _ => None,
    };
    let (stdout_truncated, stderr_truncated) = (flag("stdout_truncated"), flag("stderr_truncated"));
    let limit = match exit.limit {
        None if exit.timed_out => Some(LimitKind::Time),
        None if stdout_truncated || stderr_truncated => Some(LimitKind::Output),
        other => other,
    };
    ExecResult {
        sandbox_id: text("sandbox_id"),
        isolation: serde_json::from_value(answer["isolation"].clone()).unwrap_or_default(),
        exit_code: exit.exit_code,
        signal: exit.signal,
        stdout: text("stdout"),
        stdout_base64: answer["stdout_base64"].as_str().map(str::to_owned),
        stderr: text("stderr"),
        stderr_base64: answer["stderr_base64"].as_str().map(str::to_owned),
        stdout_truncated,
        stderr_truncated,
        timed_out: exit.timed_out,
        oom_killed: exit.oom_killed,
        limit,
        duration_ms: answer["duration_ms"].as_f64().unwrap_or_default(),
        phases: exit.phases,
        usage: exit.usage,
        error,
    }
}

fn text_of(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_results_become_the_local_result_and_exit_code() {
        let ok = to_result(&json!({"sandbox_id": "sb-1", "exit_code": 3, "signal": null, "stdout": "hi\n",
            "stderr": "", "stdout_truncated": false, "stderr_truncated": false, "timed_out": false, "duration_ms": 4.5}));
        assert_eq!((ok.exit_code, ok.stdout.as_str(), ok.limit), (Some(3), "hi\n", None));
        assert_eq!(exit_codes::for_result(&ok), 3);
        let timed_out = to_result(&json!({"exit_code": null, "signal": 9, "timed_out": true}));
        assert_eq!(exit_codes::for_result(&timed_out), exit_codes::TIMEOUT);
        let cut = to_result(&json!({"exit_code": null, "signal": 9, "stderr_truncated": true}));
        assert_eq!(exit_codes::for_result(&cut), exit_codes::OUTPUT_LIMIT);
        let compile = to_result(&json!({"exit_code": 1, "error": {"code": "compile_error", "message": "no"}}));
        assert_eq!(exit_codes::for_result(&compile), exit_codes::COMPILE_ERROR);
        let killed = to_result(&json!({"exit_code": null, "signal": 9}));
        assert_eq!(exit_codes::for_result(&killed), 137);
    }
}
