//! Moving bytes between commands and the channel: output pipes → `Output` frames (at most 64 KiB raw each, in
//! order per stream), queued stdin → the command's stdin pipe, and the end of a command: `ExecExited` once both
//! output pipes reached end-of-file, or once its process exited and the drain window passed (a daemon it left behind
//! may hold the pipes open forever).
//!
//! Once more than the host's output limit of a stream was sent (or the host said `StopOutput`), the stream is still
//! read but discarded here: the writer goes on as if it were read (no `SIGPIPE` for a program that prints a lot), the
//! reading is the sandbox's own CPU (the agent is in its cgroup), and the host gets nothing more to carry.

use std::os::fd::OwnedFd;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rustix::io::Errno;
use sandkasten_protocol::{MAX_OUTPUT_CHUNK_BYTES, Message};
use sandkasten_types::StreamKind;

use super::channel::Channel;
use super::commands::{Command, Commands};

/// Most bytes read from one pipe when a command is finished after its drain window (a full pipe buffer at most
/// holds what the command wrote before exiting; anything beyond is a leftover daemon's).
const FINAL_DRAIN_BYTES: usize = 1 << 20;

/// What one read from a pipe gave.
enum Chunk {
    Data(usize),
    NotReady,
    End,
}

fn read_chunk(fd: &OwnedFd, buffer: &mut [u8]) -> Chunk {
    loop {
        match rustix::io::read(fd, &mut *buffer) {
            Ok(0) => return Chunk::End,
            Ok(n) => return Chunk::Data(n),
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => return Chunk::NotReady,
            Err(_) => return Chunk::End,
        }
    }
}

fn slot(command: &mut Command, stream: StreamKind) -> &mut Option<OwnedFd> {
    match stream {
        StreamKind::Stdout => &mut command.stdout,
        StreamKind::Stderr => &mut command.stderr,
    }
}

fn index(stream: StreamKind) -> usize {
    match stream {
        StreamKind::Stdout => 0,
        StreamKind::Stderr => 1,
    }
}

/// Reads up to `budget` bytes from one stream into `Output` frames; returns the bytes read.
fn pump(channel: &mut Channel, id: u64, command: &mut Command, stream: StreamKind, budget: usize) -> usize {
    let mut buffer = vec![0u8; MAX_OUTPUT_CHUNK_BYTES];
    let mut total = 0;
    while total < budget {
        let Some(fd) = slot(command, stream).as_ref() else { break };
        match read_chunk(fd, &mut buffer) {
            Chunk::Data(n) => {
                total += n;
                if command.discarding[index(stream)] {
                    continue;
                }
                channel.queue(id, Message::Output { stream, data: STANDARD.encode(&buffer[..n]) });
                let sent = &mut command.sent[index(stream)];
                *sent = sent.saturating_add(n as u64);
                if command.output_limit.is_some_and(|limit| *sent > limit) {
                    // The host keeps no more of this stream: read the rest into nothing.
                    command.discarding[index(stream)] = true;
                }
            }
            Chunk::NotReady => break,
            Chunk::End => *slot(command, stream) = None,
        }
    }
    total
}

/// The pipe is readable: one chunk goes to the channel.
pub fn read_output(commands: &mut Commands, channel: &mut Channel, id: u64, stream: StreamKind) {
    if let Some(command) = commands.table.get_mut(&id) {
        pump(channel, id, command, stream, 1);
    }
}

/// The host keeps no more of a stream: discard the rest of it (a command that is not running any more is ignored).
pub fn stop_output(commands: &mut Commands, id: u64, stream: StreamKind) {
    if let Some(command) = commands.table.get_mut(&id) {
        command.discarding[index(stream)] = true;
    }
}

/// The stdin pipe is writable: write what is queued; close it when asked and drained, or when the reader is gone.
pub fn write_stdin(commands: &mut Commands, id: u64) {
    let Some(command) = commands.table.get_mut(&id) else { return };
    let Some(stdin) = command.stdin.as_mut() else { return };
    let mut written = 0;
    let mut gone = false;
    while written < stdin.pending.len() {
        match rustix::io::write(&stdin.fd, &stdin.pending[written..]) {
            Ok(n) => written += n,
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => break,
            // EPIPE: the command closed its stdin; what is left can never be delivered.
            Err(_) => {
                gone = true;
                break;
            }
        }
    }
    stdin.pending.drain(..written);
    if gone || (stdin.pending.is_empty() && stdin.close_when_drained) {
        command.stdin = None;
    }
}

/// Reports and forgets every command that is finished. With output paused (the channel is congested) a command
/// whose pipes are still open waits: its last output must go out before its `ExecExited`.
pub fn report_finished(commands: &mut Commands, channel: &mut Channel, now_ns: u64, home: &str, disk_bytes: u64) {
    let ids: Vec<u64> = commands
        .table
        .iter()
        .filter(|(_, c)| {
            let pipes_closed = c.stdout.is_none() && c.stderr.is_none();
            c.exit.is_some() && (pipes_closed || (c.drain_expired(now_ns) && !channel.congested()))
        })
        .map(|(&id, _)| id)
        .collect();
    for id in ids {
        let Some(mut command) = commands.table.remove(&id) else { continue };
        for stream in [StreamKind::Stdout, StreamKind::Stderr] {
            pump(channel, id, &mut command, stream, FINAL_DRAIN_BYTES);
        }
        let disk_full = [home, "/tmp", "/dev/shm"].iter().any(|mount| is_full(mount, disk_bytes));
        channel.queue(id, Message::ExecExited { exit: command.command_exit(disk_full) });
    }
}

/// A writable filesystem counts as full when less than 64 KiB or 1 % of it is left, or when it holds the disk limit
/// `disk_bytes` but for that much (a microVM's disk is an ext4 image a little larger than the limit, whose
/// `RLIMIT_FSIZE` stops a single file at the limit before the filesystem is full; a tmpfs's size is the limit).
pub(crate) fn is_full(mount: &str, disk_bytes: u64) -> bool {
    let Ok(stat) = rustix::fs::statvfs(mount) else { return false };
    let available = stat.f_bavail.saturating_mul(stat.f_frsize);
    let total = stat.f_blocks.saturating_mul(stat.f_frsize);
    let used = stat.f_blocks.saturating_sub(stat.f_bfree).saturating_mul(stat.f_frsize);
    let slack = |size: u64| (size / 100).max(64 << 10);
    let holds_the_limit = disk_bytes > 0 && used.saturating_add(slack(disk_bytes)) >= disk_bytes;
    total > 0 && (available < slack(total) || holds_the_limit)
}
