//! The serve loop: one thread, one `poll` over the host channel, the SIGCHLD signalfd, every command's pipes,
//! every directory watch's inotify descriptor and every port stream's connection, with the commands' deadlines as
//! its timeout. Requests are handled as they arrive; file requests synchronously
//! (they touch only regular files and directories, so they cannot block on a command).
//!
//! Backpressure: while the outgoing queue is above the high-water mark, neither commands' output nor new requests
//! are read; the host taking frames off the channel is what lets the loop go on. Memory stays bounded whatever a
//! command writes.

use std::os::fd::AsFd;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::io::Errno;
use sandkasten_protocol::{Envelope, Message, ProtocolError, monotonic_ns};
use sandkasten_types::{Failure, FailureKind, StreamKind};

use super::channel::{Channel, Received};
use super::commands::{CommandContext, Commands};
use super::errors::ServeError;
use super::ports::PortStreams;
use super::signals::ChildSignals;
use super::sudo::{Sudo, SudoUnavailable};
use super::watch::Watches;
use super::{files, output};

/// Which descriptor a poll entry watches.
#[derive(Debug, Clone, Copy)]
enum Watch {
    Channel,
    Children,
    Output(u64, StreamKind),
    Stdin(u64),
    Directory(u64),
    Port(u64),
    SudoListener,
    Sudo(u64),
}

/// How the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoopEnd {
    /// The host asked for it (`Shutdown`).
    Shutdown,
    /// The host closed the channel.
    HostGone,
}

/// Runs the loop until `Shutdown` or the host goes away; every command's process group is killed on the way out.
pub fn run(channel: &mut Channel, signals: &ChildSignals, context: &CommandContext<'_>) -> Result<LoopEnd, ServeError> {
    let mut commands = Commands::default();
    let sudo = match Sudo::open() {
        Ok(sudo) => Some(sudo),
        Err(SudoUnavailable::NoRunDirectory) => None,
        Err(error @ SudoUnavailable::Setup(_)) => {
            // The sandbox works on without it; its `sudo` says the socket is missing.
            eprintln!("sandkasten agent: no sudo in this sandbox: {error}");
            None
        }
    };
    let mut served = Served { sudo, ..Served::default() };
    let result = serve_requests(channel, signals, context, &mut commands, &mut served);
    commands.kill_all();
    if let Some(sudo) = &mut served.sudo {
        sudo.kill_all();
    }
    if result.as_ref().is_ok_and(|end| *end == LoopEnd::Shutdown) {
        channel.flush_for(5_000);
    }
    result
}

/// What the loop serves besides commands: directory watches, port streams and `sudo` inside the sandbox.
#[derive(Default)]
struct Served {
    directories: Watches,
    ports: PortStreams,
    sudo: Option<Sudo>,
}

fn serve_requests(
    channel: &mut Channel,
    signals: &ChildSignals,
    context: &CommandContext<'_>,
    commands: &mut Commands,
    served: &mut Served,
) -> Result<LoopEnd, ServeError> {
    loop {
        let now = monotonic_ns();
        commands.enforce_timeouts(now);
        if let Some(sudo) = &mut served.sudo {
            sudo.expire(now);
        }
        if !commands.quiet {
            output::report_finished(commands, channel, now, context.home, context.disk_bytes);
        }
        channel.flush();
        if channel.broken() {
            return Ok(LoopEnd::HostGone);
        }
        let paused = channel.congested();
        let quiet = paused || commands.quiet;

        let mut channel_interest = if paused { PollFlags::empty() } else { PollFlags::IN };
        if channel.queued() > 0 {
            channel_interest |= PollFlags::OUT;
        }
        let mut watches = vec![Watch::Channel, Watch::Children];
        let mut fds = vec![
            PollFd::from_borrowed_fd(channel.fd(), channel_interest),
            PollFd::from_borrowed_fd(signals.fd(), PollFlags::IN),
        ];
        for (&id, command) in &commands.table {
            let outputs = [(StreamKind::Stdout, &command.stdout), (StreamKind::Stderr, &command.stderr)];
            for (stream, fd) in outputs.into_iter().filter(|_| !quiet) {
                if let Some(fd) = fd {
                    watches.push(Watch::Output(id, stream));
                    fds.push(PollFd::from_borrowed_fd(fd.as_fd(), PollFlags::IN));
                }
            }
            if let Some(stdin) = command.stdin.as_ref().filter(|s| !s.pending.is_empty()) {
                watches.push(Watch::Stdin(id));
                fds.push(PollFd::from_borrowed_fd(stdin.fd.as_fd(), PollFlags::OUT));
            }
        }
        for (id, fd) in served.directories.fds().filter(|_| !quiet) {
            watches.push(Watch::Directory(id));
            fds.push(PollFd::from_borrowed_fd(fd, PollFlags::IN));
        }
        // Nothing about a port stream is sent while quiesced; while congested, acknowledgements still are (small).
        for (id, fd, interest) in served.ports.interests(!paused).filter(|_| !commands.quiet) {
            watches.push(Watch::Port(id));
            fds.push(PollFd::from_borrowed_fd(fd, interest));
        }
        // `sudo` is the sandbox's own business: served while quiesced too (nothing of it crosses the channel).
        if let Some(sudo) = &served.sudo {
            watches.push(Watch::SudoListener);
            fds.push(PollFd::from_borrowed_fd(sudo.listener(), PollFlags::IN));
            for (id, fd) in sudo.connections() {
                watches.push(Watch::Sudo(id));
                fds.push(PollFd::from_borrowed_fd(fd, PollFlags::IN));
            }
        }
        let sudo_due = served.sudo.as_ref().and_then(Sudo::next_due_ns);
        let due = [commands.next_due_ns(quiet), sudo_due].into_iter().flatten().min();
        let timeout = due.map(|due| {
            let left = due.saturating_sub(now);
            Timespec { tv_sec: (left / 1_000_000_000) as i64, tv_nsec: (left % 1_000_000_000) as i64 }
        });
        match poll(&mut fds, timeout.as_ref()) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(errno) => return Err(ServeError::Poll(errno)),
        }
        let ready: Vec<(Watch, PollFlags)> =
            watches.into_iter().zip(fds.iter().map(PollFd::revents)).filter(|(_, r)| !r.is_empty()).collect();
        drop(fds);

        for (what, revents) in ready {
            match what {
                Watch::Children => {
                    let reaped = signals.reap();
                    if let Some(holder) = context.host_connections {
                        holder.reaped(&reaped.iter().map(|(pid, _)| *pid).collect::<Vec<_>>());
                    }
                    commands.record_exits(&reaped, monotonic_ns());
                    if let Some(sudo) = &mut served.sudo {
                        sudo.reaped(&reaped);
                    }
                }
                Watch::SudoListener => {
                    if let Some(sudo) = &mut served.sudo {
                        sudo.accept(monotonic_ns());
                    }
                }
                Watch::Sudo(id) => {
                    if let Some(sudo) = &mut served.sudo {
                        sudo.ready(context, id);
                    }
                }
                Watch::Output(id, stream) => output::read_output(commands, channel, id, stream),
                Watch::Stdin(id) => output::write_stdin(commands, id),
                Watch::Directory(id) => {
                    let (frames, ended) = served.directories.read(context.root, id);
                    for events in frames {
                        channel.queue(id, Message::WatchEvents { events });
                    }
                    if ended {
                        let gone = "the watched directory was removed or moved away; the watch ended";
                        channel.queue(id, Message::Failed(Failure::new(FailureKind::NotFound, gone)));
                    }
                }
                Watch::Port(id) => served.ports.ready(channel, id, revents),
                Watch::Channel => {
                    if revents.contains(PollFlags::OUT) {
                        channel.flush();
                    }
                    if revents.intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR)
                        && channel_interest.contains(PollFlags::IN)
                    {
                        if channel.receive() == Received::Closed {
                            return Ok(LoopEnd::HostGone);
                        }
                    } else if revents.intersects(PollFlags::HUP | PollFlags::ERR) && channel.queued() == 0 {
                        return Ok(LoopEnd::HostGone);
                    }
                }
            }
        }
        // Requests buffered earlier (left when the queue filled up) are taken as soon as there is room again, whether
        // or not the host sent anything new.
        if !channel.congested()
            && let Some(end) = handle_requests(channel, context, commands, served)?
        {
            return Ok(end);
        }
    }
}

/// Handles every complete request buffered; `Some` when one of them ends the loop.
fn handle_requests(
    channel: &mut Channel,
    context: &CommandContext<'_>,
    commands: &mut Commands,
    served: &mut Served,
) -> Result<Option<LoopEnd>, ServeError> {
    loop {
        let envelope = match channel.next_request() {
            Ok(Some(envelope)) => envelope,
            Ok(None) => return Ok(None),
            // The frame was consumed: answer and go on with the next one.
            Err(error @ (ProtocolError::Malformed(_) | ProtocolError::UnsupportedVersion(_))) => {
                let message = format!("malformed request: {error}");
                channel.queue(0, Message::Failed(Failure::new(FailureKind::Internal, message)));
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        let Envelope { id, msg, .. } = envelope;
        if msg == Message::Shutdown {
            commands.kill_all();
            channel.queue(id, Message::Done);
            return Ok(Some(LoopEnd::Shutdown));
        }
        match msg {
            Message::StopOutput { stream } => {
                output::stop_output(commands, id, stream);
                continue;
            }
            Message::Resumed { paused_ns } => {
                commands.postpone_deadlines(paused_ns);
                commands.quiet = false;
                if let Some(holder) = context.host_connections {
                    holder.reopen();
                }
                continue;
            }
            msg @ (Message::PortOpen { .. }
            | Message::PortData { .. }
            | Message::PortAck { .. }
            | Message::PortEof
            | Message::PortClose) => {
                served.ports.handle(channel, id, msg);
                continue;
            }
            Message::Quiesce => {
                if let Some(holder) = context.host_connections {
                    holder.close_all();
                }
                commands.quiet = true;
                channel.queue(id, Message::Done);
                continue;
            }
            _ => {}
        }
        let reply = handle_request(context, commands, &mut served.directories, id, msg).unwrap_or_else(Message::Failed);
        channel.queue(id, reply);
        if channel.congested() {
            // The rest waits until the host has read some replies.
            return Ok(None);
        }
    }
}

fn decode(data: &str, what: &str) -> Result<Vec<u8>, Failure> {
    STANDARD.decode(data).map_err(|e| Failure::new(FailureKind::Internal, format!("{what} is not valid base64: {e}")))
}

fn handle_request(
    context: &CommandContext<'_>,
    commands: &mut Commands,
    directories: &mut Watches,
    id: u64,
    msg: Message,
) -> Result<Message, Failure> {
    match msg {
        Message::Exec { spec, background, output_limit } => {
            let pid = commands.start(context, id, &spec, background, output_limit, monotonic_ns())?;
            Ok(Message::ExecStarted { pid: pid as u32 })
        }
        Message::StdinData { data } => commands.stdin_data(id, &decode(&data, "stdin data")?).map(|()| Message::Done),
        Message::StdinClose => commands.stdin_close(id).map(|()| Message::Done),
        Message::Signal { signal } => commands.signal(id, signal).map(|()| Message::Done),
        Message::Resize { size } => commands.resize(id, size).map(|()| Message::Done),
        Message::ListCommands => Ok(Message::Commands { running: commands.list() }),
        Message::DiskUsage => super::disk::usage(context.root, context.home),
        Message::WatchStart { path, recursive } => {
            directories.start(context.root, id, &path, recursive).map(|()| Message::Done)
        }
        Message::WatchStop => {
            directories.stop(id);
            Ok(Message::Done)
        }
        msg @ (Message::FileRead { .. }
        | Message::FileWrite { .. }
        | Message::FileList { .. }
        | Message::FileStat { .. }
        | Message::Mkdir { .. }
        | Message::Rename { .. }
        | Message::Remove { .. }
        | Message::SetMetadata { .. }
        | Message::AsUser { .. }) => files::handle(context.root, &msg),
        other => {
            let mut name = format!("{other:?}");
            name.truncate(name.find([' ', '{']).unwrap_or(name.len()));
            Err(Failure::new(FailureKind::Internal, format!("{name} is not a request the agent serves")))
        }
    }
}
