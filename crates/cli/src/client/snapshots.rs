//! `sandkasten sandbox snapshot ID` and `sandbox fork ID`, and `sandkasten snapshot list|info|rm`: the client side of
//! the server's snapshots and forks. The server does the copying; while it works the client shows on a terminal a
//! progress bar of the bytes saved or restored (read from the snapshot's `transfers` while the request runs), or a
//! spinner with the time so far for a fork (nothing when stderr is not a terminal, so scripts see only the ids).

use std::time::Duration;

use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};

use crate::client::commands::sandbox_path;
use crate::client::http::{Client, ClientError};
use crate::client::output;

/// Arguments of `sandkasten snapshot`.
#[derive(Debug, Args)]
#[command(after_help = "Take snapshots with `sandkasten sandbox snapshot ID`; start a sandbox on one with \
    `sandkasten sandbox create --from SNAPSHOT`.")]
pub struct SnapshotArgs {
    /// URL of the sandkasten server.
    #[arg(long, global = true, env = "SANDKASTEN_URL", hide_env_values = true, default_value = super::DEFAULT_URL, value_name = "URL")]
    pub url: String,
    #[command(subcommand)]
    pub command: SnapshotCommand,
}

/// `sandkasten snapshot …`.
#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// List your snapshots.
    List {
        /// Print `{"snapshots": [...]}` as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one snapshot.
    Info {
        /// Snapshot id.
        id: String,
        /// Print it as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete snapshots (their chunks that no other snapshot uses go too).
    Rm {
        /// Snapshot ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

/// Runs `sandkasten snapshot …` and returns the exit code.
pub fn run(args: SnapshotArgs) -> i32 {
    let key = std::env::var("SANDKASTEN_API_KEY").ok();
    let outcome = Client::new(&args.url, key).and_then(|client| match args.command {
        SnapshotCommand::List { json } => list(&client, json),
        SnapshotCommand::Info { id, json } => info(&client, &id, json),
        SnapshotCommand::Rm { ids } => remove(&client, &ids),
    });
    outcome.unwrap_or_else(|error| {
        eprintln!("sandkasten: {}", error.message);
        error.exit_code
    })
}

/// The API path of snapshot `id`; an id that cannot be one is refused here (it could change the path).
fn snapshot_path(id: &str) -> Result<String, ClientError> {
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(ClientError::input(format!("'{id}' is not a snapshot id (sn- and 16 hex digits)")));
    }
    Ok(format!("/v1/snapshots/{id}"))
}

/// Shows `what` with a spinner and the elapsed time on a terminal while `work` runs.
fn with_spinner<T>(what: &str, work: impl FnOnce() -> T) -> T {
    let spinner = ProgressBar::new_spinner();
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        spinner.set_style(
            ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        spinner.set_message(what.to_owned());
        spinner.enable_steady_tick(Duration::from_millis(100));
    } else {
        spinner.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let result = work();
    spinner.finish_and_clear();
    result
}

/// `sandbox snapshot ID`: prints the snapshot's id (or it as JSON).
pub fn take(client: &Client, id: &str, name: Option<&str>, memory: bool, json: bool) -> Result<i32, ClientError> {
    let path = format!("{}/snapshots", sandbox_path(id)?);
    let mut body = json!({ "memory": memory });
    if let Some(name) = name {
        body["name"] = name.into();
    }
    let watch = Watch::Saving { sandbox: id.to_owned() };
    let snapshot = with_transfer_bar(client, &format!("saving {id}"), &watch, || client.post_json(&path, &body))?;
    if json {
        output::print_json(&snapshot);
    } else {
        println!("{}", snapshot["snapshot_id"].as_str().unwrap_or_default());
    }
    Ok(0)
}

/// `sandbox fork ID --count N`: prints the copies' ids, one per line (or them as JSON).
pub fn fork(client: &Client, id: &str, count: u64, json: bool) -> Result<i32, ClientError> {
    let path = format!("{}/fork", sandbox_path(id)?);
    let forked = with_spinner(&format!("forking {id}"), || client.post_json(&path, &json!({ "count": count })))?;
    if json {
        output::print_json(&forked);
    } else {
        for sandbox in forked["sandboxes"].as_array().into_iter().flatten() {
            println!("{}", sandbox["id"].as_str().unwrap_or_default());
        }
    }
    Ok(0)
}

/// `sandbox create --from SNAPSHOT`: the create, with a spinner while the files are unpacked.
pub fn create_from(client: &Client, snapshot: &str, body: &Value) -> Result<Value, ClientError> {
    let watch = Watch::Restoring { snapshot: snapshot.to_owned() };
    with_transfer_bar(client, &format!("restoring {snapshot}"), &watch, || client.post_json("/v1/sandboxes", body))
}

/// Which transfer a progress bar follows.
enum Watch {
    /// The save of a snapshot of this sandbox (the one `saving` snapshot of it in the list).
    Saving { sandbox: String },
    /// A restore from this snapshot.
    Restoring { snapshot: String },
}

/// How often the bar asks the server how far the transfer is.
const PROGRESS_POLL: Duration = Duration::from_millis(250);

/// `(bytes_done, bytes_total)` of the transfer `watch` follows, if the server shows one now.
fn transfer_progress(client: &Client, watch: &Watch) -> Option<(u64, Option<u64>)> {
    let (snapshots, direction) = match watch {
        Watch::Saving { sandbox } => {
            let listed = client.get_json("/v1/snapshots", &[]).ok()?;
            let saving = listed["snapshots"].as_array()?.iter().find(|snapshot| {
                snapshot["sandbox_id"].as_str() == Some(sandbox) && snapshot["state"].as_str() == Some("saving")
            })?;
            (vec![saving.clone()], "saving")
        }
        Watch::Restoring { snapshot } => {
            (vec![client.get_json(&snapshot_path(snapshot).ok()?, &[]).ok()?], "restoring")
        }
    };
    let transfer = snapshots[0]["transfers"].as_array()?.iter().find(|t| t["direction"].as_str() == Some(direction))?;
    Some((transfer["bytes_done"].as_u64()?, transfer["bytes_total"].as_u64()))
}

/// Runs `work` (the request) while, on a terminal, a bar shows the bytes of the transfer `watch` follows (a spinner
/// with the bytes so far while their total is unknown).
fn with_transfer_bar<T: Send>(client: &Client, what: &str, watch: &Watch, work: impl FnOnce() -> T + Send) -> T {
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return work();
    }
    let bar = ProgressBar::new_spinner();
    let unknown = ProgressStyle::with_template("{spinner} {msg} {bytes} ({elapsed})")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    let known = ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ({elapsed})")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(unknown);
    bar.set_message(what.to_owned());
    bar.enable_steady_tick(Duration::from_millis(100));
    let done = std::sync::atomic::AtomicBool::new(false);
    let result = std::thread::scope(|scope| {
        let request = scope.spawn(|| {
            let result = work();
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            result
        });
        let mut sized = false;
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            if let Some((bytes, total)) = transfer_progress(client, watch) {
                if let Some(total) = total
                    && !sized
                {
                    bar.set_style(known.clone());
                    sized = true;
                    bar.set_length(total);
                }
                if let Some(total) = total {
                    bar.set_length(total.max(bytes));
                }
                bar.set_position(bytes);
            }
            let asked = std::time::Instant::now();
            while asked.elapsed() < PROGRESS_POLL && !done.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        request.join()
    });
    bar.finish_and_clear();
    match result {
        Ok(result) => result,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

fn list(client: &Client, json: bool) -> Result<i32, ClientError> {
    let answer = client.get_json("/v1/snapshots", &[])?;
    if json {
        output::print_json(&answer);
        return Ok(0);
    }
    println!("{:<20} {:<20} {:<8} {:>12} {:>12}  NAME", "SNAPSHOT", "SANDBOX", "STATE", "SIZE", "STORED");
    for snapshot in answer["snapshots"].as_array().into_iter().flatten() {
        let text = |key: &str| snapshot[key].as_str().unwrap_or("-").to_owned();
        let number = |key: &str| snapshot[key].as_u64().unwrap_or(0);
        println!(
            "{:<20} {:<20} {:<8} {:>12} {:>12}  {}",
            text("snapshot_id"),
            text("sandbox_id"),
            text("state"),
            number("size_bytes"),
            number("stored_bytes"),
            snapshot["name"].as_str().unwrap_or("")
        );
    }
    Ok(0)
}

fn info(client: &Client, id: &str, json: bool) -> Result<i32, ClientError> {
    let snapshot = client.get_json(&snapshot_path(id)?, &[])?;
    if json {
        output::print_json(&snapshot);
    } else if let Some(fields) = snapshot.as_object() {
        for (key, value) in fields {
            let shown = value.as_str().map_or_else(|| value.to_string(), str::to_owned);
            println!("{key:<14} {shown}");
        }
    }
    Ok(0)
}

fn remove(client: &Client, ids: &[String]) -> Result<i32, ClientError> {
    let mut code = 0;
    for id in ids {
        match snapshot_path(id).and_then(|path| client.delete(&path)) {
            Ok(()) => println!("{id}"),
            Err(error) => {
                eprintln!("sandkasten: {}", error.message);
                code = code.max(error.exit_code);
            }
        }
    }
    Ok(code)
}
