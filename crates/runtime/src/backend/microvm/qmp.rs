//! QEMU's monitor (QMP) of one microVM: QEMU listens on a unix socket the spawner bound in the sandbox's private
//! directory (`qmp.sock`, 0600, root's; QEMU got the listening descriptor, not the path, so nothing in the VMM's
//! jail can reach it by name), and the spawner connects for each operation (pause, resume, snapshot): the greeting,
//! `qmp_capabilities`, then commands, each answered within a timeout. Events that arrive meanwhile are kept (a
//! bounded number) for `wait_for_event`. A connection per operation keeps QEMU from queueing events for a reader
//! that is not there.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// How long QEMU may take to answer one command (a `stop` waits for the vCPUs to leave guest code).
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Events kept while waiting for an answer; older ones are dropped.
const KEPT_EVENTS: usize = 64;

/// The longest line QEMU may send (a `query-migrate` answer is ~1 KiB).
const MAX_LINE_BYTES: u64 = 1 << 20;

/// A failed monitor step.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QmpError {
    /// The monitor socket could not be reached (the VMM is gone).
    #[error("connecting to the VMM's monitor {path}: {source}")]
    Connect { path: String, source: std::io::Error },
    /// Reading or writing the monitor socket failed.
    #[error("talking to the VMM's monitor: {0}")]
    Io(#[from] std::io::Error),
    /// QEMU closed the monitor (it exited).
    #[error("the VMM closed its monitor")]
    Closed,
    /// QEMU did not answer within the timeout.
    #[error("the VMM did not answer {0} in time")]
    Timeout(String),
    /// QEMU refused a command.
    #[error("the VMM refused {command}: {description}")]
    Refused { command: String, description: String },
    /// QEMU sent something that is not QMP.
    #[error("the VMM's monitor sent {0}")]
    Garbled(String),
}

/// One connection to a VMM's monitor, in command mode.
pub(crate) struct Qmp {
    stream: UnixStream,
    reader: BufReader<UnixStream>,
    events: Vec<Value>,
}

impl Qmp {
    /// Connects to the monitor at `path`, reads QEMU's greeting and leaves capability negotiation.
    pub(crate) fn connect(path: &Path) -> Result<Qmp, QmpError> {
        Qmp::connect_within(path, COMMAND_TIMEOUT)
    }

    /// `connect`, waiting up to `timeout` for the greeting (a VMM that loads a memory snapshot greets once loaded).
    pub(crate) fn connect_within(path: &Path, timeout: Duration) -> Result<Qmp, QmpError> {
        let stream = UnixStream::connect(path)
            .map_err(|source| QmpError::Connect { path: path.display().to_string(), source })?;
        let reader = BufReader::new(stream.try_clone()?);
        let mut qmp = Qmp { stream, reader, events: Vec::new() };
        let greeting = qmp.read_message(Instant::now() + timeout, "the greeting")?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Garbled(format!("{greeting} instead of its greeting")));
        }
        qmp.execute("qmp_capabilities", Value::Null)?;
        Ok(qmp)
    }

    /// Runs `command` with `arguments` (`Null` for none); its `return` value.
    pub(crate) fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, QmpError> {
        self.execute_passing(command, arguments, None)
    }

    /// Runs `command`, passing `fd` with it (SCM_RIGHTS: what `add-fd` and `getfd` take).
    pub(crate) fn execute_with_fd(
        &mut self,
        command: &str,
        arguments: Value,
        fd: BorrowedFd<'_>,
    ) -> Result<Value, QmpError> {
        self.execute_passing(command, arguments, Some(fd))
    }

    fn execute_passing(
        &mut self,
        command: &str,
        arguments: Value,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<Value, QmpError> {
        let mut request = json!({ "execute": command });
        if !arguments.is_null() {
            request["arguments"] = arguments;
        }
        let mut line = request.to_string().into_bytes();
        line.push(b'\n');
        let sent = match fd {
            Some(fd) => send_with_fd(self.stream.as_fd(), &line, fd),
            None => self.stream.write_all(&line),
        };
        match sent {
            Err(e) if matches!(e.kind(), std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset) => {
                return Err(QmpError::Closed);
            }
            other => other?,
        }
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        loop {
            let mut message = self.read_message(deadline, command)?;
            if let Some(answer) = message.get_mut("return") {
                return Ok(answer.take());
            }
            if let Some(error) = message.get("error") {
                let description = error.get("desc").and_then(Value::as_str).unwrap_or("no reason given").to_owned();
                return Err(QmpError::Refused { command: command.to_owned(), description });
            }
            self.keep_event(message)?;
        }
    }

    /// Waits until QEMU sends the event `name` (or has sent it since the connection began); its `data`.
    pub(crate) fn wait_for_event(&mut self, name: &str, timeout: Duration) -> Result<Value, QmpError> {
        let is_it = |event: &Value| event.get("event").and_then(Value::as_str) == Some(name);
        if let Some(at) = self.events.iter().position(is_it) {
            return Ok(self.events.remove(at).get("data").cloned().unwrap_or(Value::Null));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let message = self.read_message(deadline, name)?;
            if is_it(&message) {
                return Ok(message.get("data").cloned().unwrap_or(Value::Null));
            }
            self.keep_event(message)?;
        }
    }

    fn keep_event(&mut self, message: Value) -> Result<(), QmpError> {
        if message.get("event").is_none() {
            return Err(QmpError::Garbled(message.to_string()));
        }
        if self.events.len() == KEPT_EVENTS {
            self.events.remove(0);
        }
        self.events.push(message);
        Ok(())
    }

    /// Reads one JSON line before `deadline`.
    fn read_message(&mut self, deadline: Instant, waiting_for: &str) -> Result<Value, QmpError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(QmpError::Timeout(waiting_for.to_owned()));
        }
        self.stream.set_read_timeout(Some(left))?;
        let mut line = String::new();
        let read = std::io::Read::take(&mut self.reader, MAX_LINE_BYTES).read_line(&mut line);
        match read {
            Ok(0) => Err(QmpError::Closed),
            Ok(_) => {
                serde_json::from_str(&line).map_err(|_| QmpError::Garbled(line.trim().chars().take(200).collect()))
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                Err(QmpError::Timeout(waiting_for.to_owned()))
            }
            // QEMU exited with our command unread.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Err(QmpError::Closed),
            Err(e) => Err(QmpError::Io(e)),
        }
    }
}

/// Writes `line` on `socket` with `fd` attached (one `sendmsg`; QEMU takes the descriptor with the command).
fn send_with_fd(socket: BorrowedFd<'_>, line: &[u8], fd: BorrowedFd<'_>) -> std::io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [fd];
    control.push(SendAncillaryMessage::ScmRights(&fds));
    let sent = sendmsg(socket, &[std::io::IoSlice::new(line)], &mut control, SendFlags::NOSIGNAL)?;
    if sent != line.len() {
        return Err(std::io::Error::other("the monitor took part of a command"));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A fake QEMU on a socket in `dir`: greets, then answers each line with the next of `answers`, stays silent for
    /// `linger` and closes.
    fn fake_qemu(
        dir: &Path,
        answers: Vec<&'static str>,
        linger: Duration,
    ) -> (std::path::PathBuf, std::thread::JoinHandle<Vec<String>>) {
        let path = dir.join("qmp.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let handle = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            stream.write_all(b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\r\n").unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut seen = Vec::new();
            for answer in std::iter::once("{\"return\": {}}").chain(answers) {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap() == 0 {
                    break;
                }
                seen.push(line.trim().to_owned());
                stream.write_all(answer.as_bytes()).unwrap();
                stream.write_all(b"\r\n").unwrap();
            }
            std::thread::sleep(linger);
            seen
        });
        (path, handle)
    }

    #[test]
    fn commands_get_their_answers_and_events_are_kept_for_later() {
        let dir = tempfile::tempdir().unwrap();
        let answers = vec![
            "{\"event\": \"STOP\", \"data\": {}}\r\n{\"return\": {}}",
            "{\"error\": {\"class\": \"GenericError\", \"desc\": \"no such fdset\"}}",
        ];
        let (path, qemu) = fake_qemu(dir.path(), answers, Duration::ZERO);
        let mut qmp = Qmp::connect(&path).unwrap();
        assert_eq!(qmp.execute("stop", Value::Null).unwrap(), json!({}));
        let refused = qmp.execute("migrate", json!({"uri": "file:/dev/fdset/9"})).unwrap_err().to_string();
        assert!(refused.contains("refused migrate: no such fdset"), "{refused}");
        assert_eq!(qmp.wait_for_event("STOP", Duration::from_millis(10)).unwrap(), json!({}));
        drop(qmp);
        let seen = qemu.join().unwrap();
        assert_eq!(seen[0], "{\"execute\":\"qmp_capabilities\"}");
        assert_eq!(seen[2], "{\"arguments\":{\"uri\":\"file:/dev/fdset/9\"},\"execute\":\"migrate\"}");
    }

    #[test]
    fn a_silent_vmm_times_out_and_a_gone_one_is_closed() {
        let dir = tempfile::tempdir().unwrap();
        let (path, qemu) = fake_qemu(dir.path(), vec![], Duration::from_millis(500));
        let mut qmp = Qmp::connect(&path).unwrap();
        let silent = qmp.wait_for_event("MIGRATION", Duration::from_millis(50)).unwrap_err();
        assert!(matches!(silent, QmpError::Timeout(_)), "{silent}");
        // The fake closes after its silence: the next answer is an end of file.
        let closed = qmp.execute("cont", Value::Null).unwrap_err();
        assert!(matches!(closed, QmpError::Closed), "{closed}");
        drop(qmp);
        let _ = qemu.join();
        let missing = Qmp::connect(&dir.path().join("nothing.sock")).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(missing.contains("connecting to the VMM's monitor"), "{missing}");
    }
}
