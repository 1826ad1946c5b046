//! `sandbox shell ID [-- COMMAND…]`: an interactive terminal in a sandbox. The command (default `bash -i -l`) starts
//! as a background command on a pseudo-terminal of this terminal's size (`pty` in `POST …/exec`); this terminal goes
//! into raw mode (restored on every way out), its keystrokes go to `…/stdin` as they are typed, its size to
//! `…/resize` on every SIGWINCH, and the command's output stream (`…/stream`) is written here as it comes. The exit
//! code is the command's.

use std::io::{IsTerminal, Read};
use std::os::fd::AsFd;
use std::thread;

use clap::Args;
use rustix::termios::{OptionalActions, Termios};
use serde_json::{Value, json};

use crate::client::commands::{environment, sandbox_path};
use crate::client::exec::{event_error, exit_code, read_events, write_chunk};
use crate::client::http::{Client, ClientError};

/// The size used when this process's output is not a terminal.
const DEFAULT_SIZE: (u16, u16) = (80, 24);
/// Most bytes of typed input sent in one request.
const INPUT_CHUNK: usize = 4096;

/// Arguments of `sandbox shell`.
#[derive(Debug, Args)]
pub struct ShellArgs {
    /// Sandbox id.
    pub id: String,
    /// Environment variable for the shell (KEY=VALUE, or KEY to pass this shell's value). Repeatable.
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Working directory inside the sandbox (absolute; default the sandbox user's home).
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// The program to run on the terminal instead of `bash -i -l` (after `--`).
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// This terminal in raw mode until dropped (then as it was).
struct RawMode {
    saved: Termios,
}

impl RawMode {
    /// Raw mode for standard input, when it is a terminal.
    fn enter() -> Option<RawMode> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return None;
        }
        let saved = rustix::termios::tcgetattr(stdin.as_fd()).ok()?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(stdin.as_fd(), OptionalActions::Now, &raw).ok()?;
        Some(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(std::io::stdin().as_fd(), OptionalActions::Now, &self.saved);
    }
}

/// This process's terminal size (columns, rows), from standard output or input; `DEFAULT_SIZE` without one.
fn local_size() -> (u16, u16) {
    let sizes = [rustix::termios::tcgetwinsize(std::io::stdout()), rustix::termios::tcgetwinsize(std::io::stdin())];
    sizes
        .into_iter()
        .flatten()
        .find(|size| size.ws_col > 0 && size.ws_row > 0)
        .map_or(DEFAULT_SIZE, |size| (size.ws_col, size.ws_row))
}

fn start_body(args: &ShellArgs) -> Result<Value, ClientError> {
    let argv = if args.command.is_empty() {
        vec!["/bin/bash".to_owned(), "-i".to_owned(), "-l".to_owned()]
    } else {
        args.command.clone()
    };
    let mut env = environment(&args.env)?;
    let term = std::env::var("TERM").ok().filter(|term| !term.is_empty() && term != "dumb");
    env.entry("TERM").or_insert_with(|| term.unwrap_or_else(|| "xterm-256color".to_owned()).into());
    let (cols, rows) = local_size();
    let mut body = json!({"argv": argv, "env": env, "background": true, "pty": {"cols": cols, "rows": rows}});
    if let Some(cwd) = &args.cwd {
        body["cwd"] = cwd.clone().into();
    }
    Ok(body)
}

/// Runs `sandbox shell` and returns the command's exit code.
pub fn shell(client: &Client, args: ShellArgs) -> Result<i32, ClientError> {
    let sandbox = sandbox_path(&args.id)?;
    let started = client.post_json(&format!("{sandbox}/exec"), &start_body(&args)?)?;
    let command_id = started["command_id"]
        .as_str()
        .ok_or_else(|| ClientError::server("the server did not say which command it started"))?;
    let command = format!("{sandbox}/commands/{command_id}");
    let events = client.get_stream(&format!("{command}/stream"))?;
    let raw = RawMode::enter();
    forward_input(client.clone(), command.clone());
    forward_resizes(client.clone(), command);
    let outcome = read_events(events, |event, data| match event {
        "stdout" | "stderr" => write_chunk(event, data).map(|()| None),
        "exit" => {
            let exit: Value = serde_json::from_str(data)
                .map_err(|e| ClientError::server(format!("the server sent a malformed exit event: {e}")))?;
            Ok(Some(exit_code(&exit, false)))
        }
        "error" => Err(event_error(data)),
        _ => Ok(None),
    });
    drop(raw);
    outcome
}

/// The longest prefix of `pending` that is whole UTF-8 (what the API's text stdin can carry), taken out of it; an
/// invalid byte is sent as U+FFFD rather than held forever.
fn take_text(pending: &mut Vec<u8>) -> String {
    match std::str::from_utf8(pending) {
        Ok(text) => {
            let text = text.to_owned();
            pending.clear();
            text
        }
        Err(error) if error.error_len().is_none() => {
            let valid = error.valid_up_to();
            let text = String::from_utf8_lossy(&pending[..valid]).into_owned();
            pending.drain(..valid);
            text
        }
        Err(_) => String::from_utf8_lossy(&std::mem::take(pending)).into_owned(),
    }
}

/// A thread that sends what is typed here to the command's stdin as it comes (it ends with this process).
fn forward_input(client: Client, command: String) {
    thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buffer = [0u8; INPUT_CHUNK];
        let mut pending = Vec::new();
        loop {
            match stdin.read(&mut buffer) {
                Ok(0) | Err(_) => return,
                Ok(n) => pending.extend_from_slice(&buffer[..n]),
            }
            let text = take_text(&mut pending);
            if !text.is_empty() && client.post_json(&format!("{command}/stdin"), &json!({"data": text})).is_err() {
                // The command ended (or the server went away): the event stream reports how.
                return;
            }
        }
    });
}

/// A thread that sends this terminal's size to the command's terminal at every SIGWINCH.
fn forward_resizes(client: Client, command: String) {
    thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
        runtime.block_on(async move {
            let kind = tokio::signal::unix::SignalKind::window_change();
            let Ok(mut winch) = tokio::signal::unix::signal(kind) else { return };
            while winch.recv().await.is_some() {
                let (cols, rows) = local_size();
                let body = json!({"cols": cols, "rows": rows});
                if client.post_json(&format!("{command}/resize"), &body).is_err() {
                    return;
                }
            }
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_text_is_sent_in_whole_characters() {
        let mut pending = "aä".as_bytes()[..2].to_vec();
        assert_eq!(take_text(&mut pending), "a");
        assert_eq!(pending, [0xc3]);
        pending.push(0xa4);
        assert_eq!(take_text(&mut pending), "ä");
        let mut invalid = vec![b'x', 0xff];
        assert_eq!(take_text(&mut invalid), "x\u{fffd}");
        assert!(invalid.is_empty());
    }
}
