//! A sandbox's files as one tar stream, out and in: the two halves of a filesystem snapshot (and of a fork). Both run
//! the image's own `tar` (`/usr/bin/tar`, read-only; `find` lists what to archive) as the sandbox user, through the jail like any command, so
//! nothing of the sandbox is read or written by the host: what the stream holds is whatever the sandbox's user can
//! read, and unpacking it can reach nothing the user could not write. The stream is untrusted data to the host; it
//! is only ever unpacked inside a sandbox of the same tenant.
//!
//! Out: the command's output is read at the consumer's pace (`AgentClient::exec_paced`), so a large filesystem is
//! never held in the server. In: chunks go to the command's stdin one request at a time; when the agent's stdin
//! buffer is full the next chunk waits and is sent again.

use std::time::Duration;

use sandkasten_types::{CommandSpec, Failure, FailureKind, OutputChunk, StreamKind};
use tokio::sync::mpsc;

use super::agent_client::AgentClient;
use super::tar_stderr::{MAX_KEPT as MAX_STDERR, TarStderr};

/// The tar every template has (read-only, from the image's `/usr`).
const TAR: &str = "/usr/bin/tar";
/// The shell that lists the directories' contents for it.
const BASH: &str = "/bin/bash";
/// Longest a tar of a sandbox may take, either way.
const TAR_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// How long to wait before sending a chunk again that the agent's full stdin buffer refused.
const STDIN_RETRY: Duration = Duration::from_millis(5);

fn spec(argv: Vec<String>) -> CommandSpec {
    CommandSpec {
        argv: Some(argv),
        cwd: Some("/".to_owned()),
        timeout_ms: Some(u64::try_from(TAR_TIMEOUT.as_millis()).unwrap_or(u64::MAX)),
        ..CommandSpec::default()
    }
}

/// `dirs` as tar's operands, relative to `/` (tar then stores relative names); refused unless absolute and plain.
fn operands(dirs: &[String]) -> Result<Vec<String>, Failure> {
    dirs.iter()
        .map(|dir| match dir.strip_prefix('/') {
            Some(relative) if !relative.is_empty() && !relative.split('/').any(|c| c.is_empty() || c == "..") => {
                Ok(relative.to_owned())
            }
            _ => Err(Failure::new(FailureKind::Internal, format!("{dir:?} is not a plain absolute directory"))),
        })
        .collect()
}

fn tar_failed(what: &str, exit_code: Option<i32>, signal: Option<i32>, stderr: &[u8]) -> Failure {
    let said = String::from_utf8_lossy(stderr);
    let how = match (exit_code, signal) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("signal {signal}"),
        (None, None) => "no exit status".to_owned(),
    };
    Failure::new(FailureKind::Conflict, format!("{what} failed inside the sandbox ({how}): {}", said.trim()))
}

/// Streams a tar of `dirs` (absolute directories inside the sandbox) to `sink`, at the sink's pace. GNU tar's exit
/// codes 1 (a file changed while it was read) and 2 (a file `find` listed was removed before tar read it) are
/// accepted when all that was said was about such files (`TarStderr`): the archive is whole, those files as tar saw
/// them or without them. Anything else (a file or directory the user cannot read) fails, naming it.
pub(super) async fn export_tar(
    agent: &AgentClient,
    dirs: &[String],
    sink: mpsc::Sender<Vec<u8>>,
) -> Result<(), Failure> {
    // The directories' contents, not the directories: their own owner and mode belong to the sandbox that unpacks
    // (the user cannot change `/tmp`'s, which tar would try).
    let mut argv = vec![
        BASH.to_owned(),
        "-c".to_owned(),
        format!(
            "set -o pipefail; export LC_ALL=C; cd / && find \"$@\" -mindepth 1 -maxdepth 1 -print0 | \
             {TAR} --create --file=- --null --files-from=- --sparse --numeric-owner"
        ),
        "export".to_owned(),
    ];
    argv.extend(operands(dirs)?);
    let (output, mut chunks) = mpsc::channel::<OutputChunk>(4);
    let forward = async move {
        let mut stderr = TarStderr::default();
        let mut sink_open = true;
        while let Some(chunk) = chunks.recv().await {
            match chunk.stream {
                StreamKind::Stdout if sink_open => sink_open = sink.send(chunk.data).await.is_ok(),
                StreamKind::Stdout => {}
                StreamKind::Stderr => stderr.push(&chunk.data),
            }
        }
        (stderr, sink_open)
    };
    let (exit, (stderr, sink_open)) = tokio::join!(agent.exec_paced(spec(argv), output), forward);
    let exit = exit?;
    if !sink_open {
        return Err(Failure::new(FailureKind::Internal, "the archive's reader went away"));
    }
    let (only_vanished_files, said) = stderr.only_vanished_files();
    match exit.exit_code {
        Some(0) => Ok(()),
        Some(1 | 2) if only_vanished_files => Ok(()),
        code => Err(tar_failed("archiving the sandbox's files", code, exit.signal, &said)),
    }
}

/// Unpacks the tar arriving on `source` at `/` inside the sandbox, as the sandbox user: existing directories keep
/// their owner and mode (`--no-overwrite-dir`), files get the archive's modes. A `source` that closes early is a
/// truncated archive (tar fails naming it).
pub(super) async fn import_tar(
    agent: &std::sync::Arc<AgentClient>,
    mut source: mpsc::Receiver<Vec<u8>>,
) -> Result<(), Failure> {
    let argv = vec![
        TAR.to_owned(),
        "--extract".to_owned(),
        "--file=-".to_owned(),
        "--directory=/".to_owned(),
        "--no-overwrite-dir".to_owned(),
        "--no-same-owner".to_owned(),
    ];
    let (command, mut events) = agent.spawn_background(spec(argv), Some(MAX_STDERR as u64)).await?;
    // A failure to feed means tar stopped reading: its exit says why (or that it had the whole archive: tar stops at
    // the end marker, before the record's padding).
    let mut fed = true;
    while let Some(data) = source.recv().await {
        if send_whole(&command, &data).await.is_err() {
            fed = false;
            break;
        }
    }
    if fed {
        let _ = command.close_stdin().await;
    }
    let mut stderr = Vec::new();
    let exit = loop {
        match events.recv().await {
            Some(super::background::BackgroundEvent::Output(StreamKind::Stderr, data)) => {
                let room = MAX_STDERR.saturating_sub(stderr.len());
                stderr.extend_from_slice(&data[..data.len().min(room)]);
            }
            Some(super::background::BackgroundEvent::Output(StreamKind::Stdout, _)) => {}
            Some(super::background::BackgroundEvent::Exited(exit)) => break exit,
            None => return Err(super::agent_client::sandbox_gone()),
        }
    };
    if exit.exit_code != Some(0) {
        return Err(tar_failed("unpacking the files", exit.exit_code, exit.signal, &stderr));
    }
    Ok(())
}

/// Writes `data` to the command's stdin, waiting while the agent's stdin buffer is full.
async fn send_whole(command: &super::background::BackgroundCommand, data: &[u8]) -> Result<(), Failure> {
    const PIECE: usize = 256 << 10;
    for piece in data.chunks(PIECE) {
        loop {
            match command.send_stdin(piece).await {
                Ok(()) => break,
                Err(failure) if failure.kind == FailureKind::StdinFull => {
                    tokio::time::sleep(STDIN_RETRY).await;
                }
                Err(failure) => return Err(failure),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn operands_are_relative_to_the_root_and_plain() {
        let dirs = vec!["/workspace".to_owned(), "/home/user".to_owned(), "/dev/shm".to_owned()];
        assert_eq!(operands(&dirs).unwrap(), ["workspace", "home/user", "dev/shm"]);
        for bad in ["/", "relative", "/a/../b", "/a//b", ""] {
            assert!(operands(&[bad.to_owned()]).is_err(), "{bad:?} accepted");
        }
    }
}
