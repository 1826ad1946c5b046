//! `sandbox code ID --lang python --code CODE`: run a cell in the sandbox's stateful interpreter (variables persist
//! between calls). Plain mode prints the cell's output, then the value of its last expression as a REPL would, and
//! the error's traceback on stderr (exit 1); `--json` prints the server's answer.

use std::io::{IsTerminal, Read, Write};

use clap::Args;
use serde_json::{Map, Value};

use sandkasten_types::units::parse_duration_ms;

use crate::client::commands::sandbox_path;
use crate::client::http::{Client, ClientError};
use crate::client::output;

/// Arguments of `sandbox code`.
#[derive(Debug, Args)]
pub struct CodeArgs {
    /// Sandbox id.
    pub id: String,
    /// Language of the cell: python (default) or javascript.
    #[arg(long, value_name = "LANG")]
    pub lang: Option<String>,
    /// The cell's source (otherwise read from standard input).
    #[arg(long)]
    pub code: Option<String>,
    /// Run in this context (default: the language's default context).
    #[arg(long, value_name = "CONTEXT_ID")]
    pub context: Option<String>,
    /// Interrupt the cell after this long, e.g. 5s (default and maximum: the sandbox's command timeout).
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
    /// Print the answer (output, results, error, execution count) as JSON.
    #[arg(long)]
    pub json: bool,
}

fn source(args: &CodeArgs) -> Result<String, ClientError> {
    if let Some(code) = &args.code {
        return Ok(code.clone());
    }
    let mut stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Err(ClientError::input("no code given: pass --code or pipe the code on stdin"));
    }
    let mut code = String::new();
    stdin.read_to_string(&mut code).map_err(|e| ClientError::input(format!("reading the code from stdin: {e}")))?;
    Ok(code)
}

fn request(args: &CodeArgs) -> Result<Value, ClientError> {
    let mut body = Map::new();
    let language = match args.lang.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None => None,
        Some("python" | "python3" | "py") => Some("python"),
        Some("javascript" | "js" | "node") => Some("javascript"),
        Some(other) => return Err(ClientError::input(format!("--lang {other}: use python or javascript"))),
    };
    // Without a language or a context, Python: the common case for an agent's interpreter.
    let language = if language.is_none() && args.context.is_none() { Some("python") } else { language };
    if let Some(language) = language {
        body.insert("language".into(), language.into());
    }
    body.insert("code".into(), source(args)?.into());
    if let Some(context) = &args.context {
        body.insert("context_id".into(), context.clone().into());
    }
    if let Some(timeout) = &args.timeout {
        let ms = parse_duration_ms(timeout).map_err(|e| ClientError::input(format!("--timeout: {e}")))?;
        body.insert("timeout_ms".into(), ms.into());
    }
    Ok(Value::Object(body))
}

/// Runs `sandbox code`: exit 0, or 1 when the cell raised an error.
pub fn code(client: &Client, args: CodeArgs) -> Result<i32, ClientError> {
    let answer = client.post_json(&format!("{}/code", sandbox_path(&args.id)?), &request(&args)?)?;
    let failed = !answer["error"].is_null();
    if args.json {
        output::print_json(&answer);
        return Ok(i32::from(failed));
    }
    let text = |key: &str| answer[key].as_str().unwrap_or_default().to_owned();
    // A closed terminal or pipe is not an error of the cell.
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text("stdout").as_bytes());
    for result in answer["results"].as_array().into_iter().flatten() {
        if let Some(plain) = result["text/plain"].as_str().filter(|_| result["is_main_result"] == true) {
            let _ = writeln!(out, "{plain}");
        } else {
            let kinds: Vec<&str> =
                result.as_object().into_iter().flatten().map(|(k, _)| k.as_str()).filter(|k| k.contains('/')).collect();
            eprintln!("sandkasten: a rich result ({}) is only shown with --json", kinds.join(", "));
        }
    }
    let _ = out.flush();
    eprint!("{}", text("stderr"));
    if failed {
        let error = &answer["error"];
        let traceback: Vec<&str> =
            error["traceback"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        for line in &traceback {
            eprintln!("{line}");
        }
        // The traceback ends with `Name: value` already; without one, say it.
        if traceback.is_empty() {
            eprintln!("{}: {}", error["name"].as_str().unwrap_or("Error"), error["value"].as_str().unwrap_or_default());
        }
    }
    if answer["context_restarted"] == true {
        eprintln!("sandkasten: the interpreter was restarted; earlier variables are gone");
    }
    Ok(i32::from(failed))
}
